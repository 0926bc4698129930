/* SPDX-License-Identifier: Apache-2.0 */
/* te-bench: throughput, latency percentiles and per-slice core cost of te transfers. */

/*
 * Modes (exactly one):
 *   --target             announce the segment ("segment: NAME", "descriptor: BASE64"), fill
 *                        the buffer with the pattern, print "ready", then serve until
 *                        SIGINT/SIGTERM or EOF on stdin (any stdin; --ignore-stdin: signals only)
 *   --initiator SEGMENT  move blocks to/from SEGMENT's largest remote buffer, one row per run
 *   --loopback           start this binary as a --target child, then act as its initiator
 *   --core               two engines in this process over the loopback test transport with
 *                        manual progress: slices per second through new -> submit -> wait -> free
 *
 * Layout of the target buffer: the first half is only ever read, so it keeps the target's
 * pattern and READ can be verified by any run; WRITEs land in the second half. Thread t uses
 * [t * batch * block, +batch * block) of each half, request k the k-th block of that range.
 * The initiator's buffer holds, per thread, a data area and a read-back area of that size.
 *
 * Pattern: byte o (offset from the start of the target buffer) is byte o % 8 of
 * mix((o / 8) XOR salt) in little-endian order; the target's own pattern has salt 0, the data a
 * verified WRITE sends in iteration i has a salt derived from i and a random per-run value,
 * so a stale (earlier iteration or run) or misplaced block does not match.
 *
 * Latency is per batch: from te_batch_new until te_batch_wait has returned and the batch is
 * freed. Every request of the batch is counted with that latency (what an application
 * waiting for its batch sees).
 * Percentiles come from a bounded reservoir sample of the batch latencies; avg and max are
 * exact. GB/s is 10^9 bytes per second; ops/s counts requests. With --verify the checking
 * and WRITE's read-back are inside the timed loop, so rates drop: verify for correctness,
 * measure without it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <glib.h>
#include <json-glib/json-glib.h>

#include <te/te.h>
#include <te/te_plugin.h>

#include "pattern.h"
#include "steal.h"
#include "te_build_config.h"

#define BENCH_EXIT_OK 0
#define BENCH_EXIT_FAIL 1
#define BENCH_EXIT_USAGE 2
#define BENCH_EXIT_SIGNAL 130
/* bench_parse_args: --version was given (not an exit status). */
#define BENCH_EXIT_VERSION -1

#define BENCH_KIB (UINT64_C(1) << 10)
#define BENCH_MIB (UINT64_C(1) << 20)
#define BENCH_GIB (UINT64_C(1) << 30)

/* Limits on what a user may ask for; sizes bounded so products cannot overflow. */
#define BENCH_MAX_BLOCK (UINT64_C(1) << 32)
#define BENCH_MAX_BATCH 65536
#define BENCH_MAX_THREADS 256
#define BENCH_MAX_DEPTH 16
#define BENCH_MAX_BUFFER (UINT64_C(1) << 40)
#define BENCH_MIN_BUFFER (8 * BENCH_KIB)
#define BENCH_MAX_DURATION (7.0 * 86400.0)
#define BENCH_MAX_ITERATIONS (INT64_C(1) << 48)
#define BENCH_MAX_WARMUP (INT64_C(1) << 20)
/* Entries of --sizes and --batches after ranges are expanded; ops of --op. */
#define BENCH_MAX_LIST 64
#define BENCH_MAX_OPS 3

/* Defaults. */
#define BENCH_DEF_BLOCK (64 * BENCH_KIB)
#define BENCH_DEF_BATCH 128
#define BENCH_DEF_DURATION 5.0
#define BENCH_DEF_SWEEP_DURATION 2.0 /* per run when there are several */
/* Untimed batches per thread before each run: connections, registrations, caches warm up. */
#define BENCH_DEF_WARMUP 8
#define BENCH_DEF_TARGET_BUFFER BENCH_GIB
/*
 * --loopback sizes its target to the runs, within these bounds (first touch is ~4 s/GiB); a run
 * that needs more than the upper one gets it while it fits in a third of MemAvailable.
 */
#define BENCH_LOOPBACK_MIN_BUFFER (64 * BENCH_MIB)
#define BENCH_LOOPBACK_MAX_BUFFER (256 * BENCH_MIB)
#define BENCH_DEF_TIMEOUT 120.0
#define BENCH_CORE_BLOCK 64
#define BENCH_CORE_BATCH 64
#define BENCH_CORE_DURATION 3.0

/* Latency samples kept per run, over all threads (8 bytes each). */
#define BENCH_MAX_SAMPLES (1u << 20)
/* A run this long (ns) or longer prints a progress line on stderr, once a second. */
#define BENCH_PROGRESS_AFTER_NS (2 * UINT64_C(1000000000))
/* How long --loopback waits for the target to announce itself, and to exit. */
#define BENCH_STARTUP_TIMEOUT_NS (120 * UINT64_C(1000000000))
/* ... and, after the announcement, for "ready": the fill, per GiB of target buffer. */
#define BENCH_FILL_TIMEOUT_NS_PER_GIB (30 * UINT64_C(1000000000))
/* The target fills its buffer in chunks of this size, watching stdin in between. */
#define BENCH_FILL_CHUNK (64 * BENCH_MIB)
#define BENCH_REAP_TIMEOUT_NS (10 * UINT64_C(1000000000))
/* Written into areas a READ is about to fill, so a READ that moves nothing fails verify. */
#define BENCH_POISON 0xa5
#define BENCH_NAME_MAX 64
#define BENCH_MAX_LANES 64 /* lanes per peer te-bench reports (tcp's own limit) */

static const uint64_t bench_sweep_sizes[] = {
	4 * BENCH_KIB, 16 * BENCH_KIB, 64 * BENCH_KIB, 256 * BENCH_KIB,
	1 * BENCH_MIB, 4 * BENCH_MIB,  16 * BENCH_MIB, 64 * BENCH_MIB,
};

enum bench_mode {
	BENCH_MODE_TARGET,
	BENCH_MODE_INITIATOR,
	BENCH_MODE_LOOPBACK,
	BENCH_MODE_CORE,
};

enum bench_op {
	BENCH_OP_READ,
	BENCH_OP_WRITE,
	BENCH_OP_MIX, /* even batches READ, odd batches WRITE */
};

struct bench_opts {
	enum bench_mode mode;
	const char *segment; /* --initiator */
	const char *config;  /* NULL: $TE_CONFIG, else the embedded default */
	enum bench_op op;    /* ops[0] */
	enum bench_op ops[BENCH_MAX_OPS];
	uint32_t n_ops;
	uint64_t block; /* sizes[0] */
	bool block_set;
	uint32_t batch; /* batches[0] */
	/* The runs of --initiator / --loopback: every size x batch x op, ops innermost. */
	uint64_t sizes[BENCH_MAX_LIST];
	uint32_t n_sizes;
	uint32_t batches[BENCH_MAX_LIST];
	uint32_t n_batches;
	uint32_t warmup; /* untimed batches per thread before each run */
	uint32_t threads;
	uint32_t depth;		    /* batches each thread keeps in flight */
	double duration_s;	    /* <= 0: no time limit (--iterations given alone) */
	int64_t iterations;	    /* batches per thread; < 0: not given */
	uint64_t buffer_size;	    /* 0: the mode's default */
	const char *target_file;    /* --target-file: map the target buffer from it (shared) */
	const char *location;	    /* --location of the target buffer ("cpu") */
	const char *local_location; /* --local-location of the initiator's buffer ("cpu") */
	double timeout_s;
	bool sweep;
	bool verify;
	bool json;
	bool quiet;
	bool ignore_stdin; /* --target: serve until a signal, whatever stdin does */
	const char *output_path;
	FILE *output; /* --output: result rows go here as well as to stdout */
};

/* Set by the SIGINT/SIGTERM handler; polled by every loop. */
static volatile sig_atomic_t bench_signalled;

static void bench_on_signal(int sig)
{
	bench_signalled = sig;
}

static void bench_signals_install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	/* No SA_RESTART: a blocked poll() must return so the loop sees the flag. */
	sa.sa_handler = bench_on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	/* A parent that closed our stdout must not kill us before we clean up. */
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);
}

/* --- messages ------------------------------------------------------------------------------ */

static void bench_vmsg(const char *prefix, const char *fmt, va_list ap) G_GNUC_PRINTF(2, 0);

static void bench_vmsg(const char *prefix, const char *fmt, va_list ap)
{
	g_autofree char *msg = g_strdup_vprintf(fmt, ap);

	fprintf(stderr, "te-bench: %s%s\n", prefix, msg);
}

static void bench_err(const char *fmt, ...) G_GNUC_PRINTF(1, 2);

static void bench_err(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	bench_vmsg("", fmt, ap);
	va_end(ap);
}

static void bench_note(const struct bench_opts *o, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

static void bench_note(const struct bench_opts *o, const char *fmt, ...)
{
	va_list ap;

	if (o->quiet)
		return;
	va_start(ap, fmt);
	bench_vmsg("note: ", fmt, ap);
	va_end(ap);
}

/* Failure of a te_* call: what was attempted, the status and the library's detail. */
static void bench_te_err(const char *what, enum te_status st)
{
	const char *detail = te_last_error();

	bench_err("%s: %s (%d)%s%s", what, te_status_str(st), st, detail[0] ? ": " : "", detail);
}

/* --- sizes and time ------------------------------------------------------------------------ */

/* "4096", "64K", "64k", "64KiB", "64KB", "1M", "1G": a byte count, K/M/G being powers of 2. */
static bool bench_parse_size(const char *s, uint64_t *out)
{
	uint64_t v, mult = 1;
	char *end;

	if (!s || !g_ascii_isdigit(s[0]))
		return false;
	errno = 0;
	v = g_ascii_strtoull(s, &end, 10);
	if (errno)
		return false;
	switch (*end) {
	case 'k':
	case 'K':
		mult = BENCH_KIB;
		break;
	case 'm':
	case 'M':
		mult = BENCH_MIB;
		break;
	case 'g':
	case 'G':
		mult = BENCH_GIB;
		break;
	default:
		break;
	}
	if (mult > 1) {
		end++;
		if (*end == 'i' || *end == 'I')
			end++;
	}
	if (*end == 'b' || *end == 'B')
		end++;
	if (*end != '\0' || (v && mult > UINT64_MAX / v))
		return false;
	*out = v * mult;
	return true;
}

/* Shortest exact spelling: 64, 4K, 1M, 1G, 1536. */
static const char *bench_size_str(uint64_t v, char *buf, size_t len)
{
	if (v && v % BENCH_GIB == 0)
		snprintf(buf, len, "%" PRIu64 "G", v / BENCH_GIB);
	else if (v && v % BENCH_MIB == 0)
		snprintf(buf, len, "%" PRIu64 "M", v / BENCH_MIB);
	else if (v && v % BENCH_KIB == 0)
		snprintf(buf, len, "%" PRIu64 "K", v / BENCH_KIB);
	else
		snprintf(buf, len, "%" PRIu64, v);
	return buf;
}

static uint64_t bench_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* CPU time (user + system) of this thread or of the whole process, in seconds. */
static double bench_cpu_s(int who)
{
	struct rusage ru;

	if (getrusage(who, &ru) != 0)
		return 0.0;
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/*
 * CPU time (user + system, all threads) of another process of ours, in seconds, from
 * /proc/<pid>/stat (clock ticks: 10 ms steps at the usual 100 Hz); negative when unreadable.
 */
static double bench_proc_cpu_s(pid_t pid)
{
	g_autofree char *path = g_strdup_printf("/proc/%d/stat", (int)pid);
	g_autofree char *text = NULL;
	unsigned long long ut, st;
	long hz = sysconf(_SC_CLK_TCK);
	const char *p;

	if (hz <= 0 || !g_file_get_contents(path, &text, NULL, NULL))
		return -1.0;
	/* After the command name, which may hold spaces and parentheses: state is field 3. */
	p = strrchr(text, ')');
	if (!p ||
	    sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return -1.0;
	return (double)(ut + st) / (double)hz;
}

static const char *bench_op_str(enum bench_op op)
{
	switch (op) {
	case BENCH_OP_READ:
		return "read";
	case BENCH_OP_WRITE:
		return "write";
	default:
		return "mix";
	}
}

/* --- memory (the pattern: bench/pattern.h) -------------------------------------------------- */

/* Anonymous memory, not yet touched (the caller touches it before timing). */
static uint8_t *bench_map(uint64_t len)
{
	char sz[32];
	void *p;

	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		bench_err("cannot allocate %s bytes: %s", bench_size_str(len, sz, sizeof(sz)),
			  g_strerror(errno));
		return NULL;
	}
	return p;
}

/*
 * The first @len bytes of @path mapped shared (a CXL window file or DAX device), for a target
 * buffer that peers reach through that shared memory. The file must be at least @len long.
 */
static uint8_t *bench_map_file(const char *path, uint64_t len)
{
	struct stat sb;
	void *p;
	int fd;

	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		bench_err("--target-file %s: %s", path, g_strerror(errno));
		return NULL;
	}
	if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size < len) {
		bench_err("--target-file %s: %" PRIu64 " bytes, the buffer needs %" PRIu64, path,
			  (uint64_t)sb.st_size, len);
		close(fd);
		return NULL;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		bench_err("--target-file %s: cannot map %" PRIu64 " bytes: %s", path, len,
			  g_strerror(errno));
		return NULL;
	}
	return p;
}

static void bench_unmap(uint8_t *p, uint64_t len)
{
	if (p)
		munmap(p, len);
}

/*
 * Device memory (cuda:N, hip:N): allocated with te_mem_alloc from the transport that owns the
 * kind, never touched by the CPU: filled and checked through a host bounce buffer and
 * te_mem_copy. Other locations (cpu, cxl:N over a mapped window) are host memory.
 */
#define BENCH_STAGE (4 * BENCH_MIB)

static bool bench_on_device(const char *loc)
{
	return loc && (g_str_has_prefix(loc, "cuda:") || g_str_has_prefix(loc, "hip:"));
}

static uint8_t *bench_alloc(struct te_engine *e, const char *loc, uint64_t len)
{
	void *p = NULL;
	enum te_status st;

	if (!bench_on_device(loc))
		return bench_map(len);
	st = te_mem_alloc(e, loc, len, &p);
	if (st != TE_OK) {
		bench_err("te_mem_alloc(%s, %" PRIu64 "): %s: %s", loc, len, te_status_str(st),
			  te_last_error());
		return NULL;
	}
	return p;
}

static void bench_release(struct te_engine *e, const char *loc, uint8_t *p, uint64_t len)
{
	if (!bench_on_device(loc)) {
		bench_unmap(p, len);
	} else if (p) {
		enum te_status st = te_mem_free(e, p);

		if (st != TE_OK)
			bench_err("te_mem_free(%s): %s: %s", loc, te_status_str(st),
				  te_last_error());
	}
}

/* Pattern @salt of offsets [off, +len) into @p (at @loc); salt UINT64_MAX: @byte everywhere. */
static bool bench_put(struct te_engine *e, const char *loc, uint8_t *p, uint64_t off, uint64_t len,
		      uint64_t salt, uint8_t byte)
{
	g_autofree uint8_t *bounce = NULL;

	if (!bench_on_device(loc)) {
		if (salt == UINT64_MAX)
			memset(p, byte, len);
		else
			pattern_fill(p, off, len, salt);
		return true;
	}
	bounce = g_malloc(MIN(len, BENCH_STAGE));
	for (uint64_t at = 0; at < len; at += BENCH_STAGE) {
		uint64_t k = MIN((uint64_t)BENCH_STAGE, len - at);
		enum te_status st;

		if (salt == UINT64_MAX)
			memset(bounce, byte, k);
		else
			pattern_fill(bounce, off + at, k, salt);
		st = te_mem_copy(e, p + at, bounce, k);
		if (st != TE_OK) {
			bench_err("te_mem_copy to %s: %s: %s", loc, te_status_str(st),
				  te_last_error());
			return false;
		}
	}
	return true;
}

/*
 * pattern_check of @p (at @loc): the index of the first byte that differs from the pattern, or
 * @len; *got_out is that byte. A failing te_mem_copy counts as a difference at its chunk.
 */
static uint64_t bench_check_at(struct te_engine *e, const char *loc, const uint8_t *p, uint64_t off,
			       uint64_t len, uint64_t salt, uint8_t *got_out)
{
	g_autofree uint8_t *bounce = NULL;

	if (!bench_on_device(loc)) {
		uint64_t at = pattern_check(p, off, len, salt);

		if (at < len)
			*got_out = p[at];
		return at;
	}
	bounce = g_malloc(MIN(len, BENCH_STAGE));
	for (uint64_t at = 0; at < len; at += BENCH_STAGE) {
		uint64_t k = MIN((uint64_t)BENCH_STAGE, len - at), bad;
		enum te_status st = te_mem_copy(e, bounce, p + at, k);

		if (st != TE_OK) {
			bench_err("te_mem_copy from %s: %s: %s", loc, te_status_str(st),
				  te_last_error());
			*got_out = 0;
			return at;
		}
		bad = pattern_check(bounce, off + at, k, salt);
		if (bad < k) {
			*got_out = bounce[bad];
			return at + bad;
		}
	}
	return len;
}

/* --- latency statistics -------------------------------------------------------------------- */

struct bench_lat {
	uint64_t *v; /* reservoir of batch latencies (ns) */
	uint32_t cap;
	uint32_t n;
	uint64_t seen;
	uint64_t sum_ns;
	uint64_t max_ns;
	uint64_t rng;
};

static uint64_t bench_rand(uint64_t *s)
{
	/* xorshift64*: plenty for picking reservoir slots. */
	uint64_t x = *s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * UINT64_C(0x2545f4914f6cdd1d);
}

static void bench_lat_add(struct bench_lat *l, uint64_t ns)
{
	uint64_t j;

	l->sum_ns += ns;
	if (ns > l->max_ns)
		l->max_ns = ns;
	l->seen++;
	if (l->n < l->cap) {
		l->v[l->n++] = ns;
		return;
	}
	j = bench_rand(&l->rng) % l->seen;
	if (j < l->cap)
		l->v[j] = ns;
}

static int bench_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted array, in microseconds. */
static double bench_pct_us(const uint64_t *sorted, size_t n, double p)
{
	size_t rank;

	if (!n)
		return 0.0;
	rank = (size_t)(p * (double)n + 0.999999);
	if (rank < 1)
		rank = 1;
	if (rank > n)
		rank = n;
	return (double)sorted[rank - 1] / 1000.0;
}

/* --- output -------------------------------------------------------------------------------- */

/* One result row of --initiator / --loopback. */
struct bench_row {
	const char *mode;
	const char *segment;
	const char *opened; /* "name" or "descriptor" */
	enum bench_op op;
	uint64_t block;
	uint32_t batch;
	uint32_t batch_requested; /* before it was reduced to fit the target buffer */
	uint32_t threads;
	uint32_t depth;
	uint32_t warmup;
	uint64_t bytes;
	uint64_t requests;
	uint64_t batches;
	uint64_t samples; /* batch latencies measured (all threads): the batches timed */
	double seconds;
	double lat_avg_us, lat_p50_us, lat_p99_us, lat_p999_us, lat_max_us;
	char transport[BENCH_NAME_MAX];
	char device[BENCH_NAME_MAX];
	/*
	 * Lanes of the transport towards the target (te_engine_stats), when it reports them:
	 * configured, and those that carried slices during the run (warm-up included), with
	 * each lane's slices.
	 */
	bool lanes_known;
	uint32_t lanes, lanes_used;
	uint64_t lane_slices[BENCH_MAX_LANES];
	/*
	 * The sends (tcp: sendmsg calls) that carried them, all lanes together, when the
	 * transport counts them (sends_known): slices over sends is how many requests one
	 * call carried.
	 */
	bool sends_known;
	uint64_t sends;
	/*
	 * Share of the machine's CPU time the hypervisor gave to other guests during the run
	 * (warm-up included; /proc/stat's steal), in percent; negative when unknown.
	 */
	double steal_pct;
	/*
	 * CPU seconds (user + system, all threads) over the timed loops, from when every thread
	 * had warmed up until they had all ended: this process's, and --loopback's target
	 * process's (negative: unknown, as for --initiator).
	 */
	double cpu_s_initiator, cpu_s_target;
	bool verify;
	bool verified;
	bool failed;
	bool interrupted;
};

static double bench_rate(double n, double seconds)
{
	return seconds > 0.0 ? n / seconds : 0.0;
}

/* Result output: stdout, and the --output file when there is one. */
static void bench_emit(const struct bench_opts *o, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

static void bench_emit(const struct bench_opts *o, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	fflush(stdout);
	if (o->output) {
		va_start(ap, fmt);
		vfprintf(o->output, fmt, ap);
		va_end(ap);
		/* Row by row, so an interrupted sweep leaves the rows it measured. */
		fflush(o->output);
	}
}

static void bench_json_print(const struct bench_opts *o, JsonBuilder *b)
{
	g_autoptr(JsonGenerator) gen = json_generator_new();
	g_autoptr(JsonNode) root = json_builder_get_root(b);
	g_autofree char *text = NULL;

	json_generator_set_root(gen, root);
	text = json_generator_to_data(gen, NULL);
	bench_emit(o, "%s\n", text);
}

static void bench_json_str(JsonBuilder *b, const char *key, const char *v)
{
	json_builder_set_member_name(b, key);
	json_builder_add_string_value(b, v);
}

static void bench_json_int(JsonBuilder *b, const char *key, int64_t v)
{
	json_builder_set_member_name(b, key);
	json_builder_add_int_value(b, v);
}

static void bench_json_dbl(JsonBuilder *b, const char *key, double v)
{
	json_builder_set_member_name(b, key);
	json_builder_add_double_value(b, v);
}

/* A measurement that may be unknown (negative): null then (steal_pct, cpu_s_*). */
static void bench_json_known(JsonBuilder *b, const char *key, double v)
{
	json_builder_set_member_name(b, key);
	if (v >= 0.0)
		json_builder_add_double_value(b, v);
	else
		json_builder_add_null_value(b);
}

static void bench_json_bool(JsonBuilder *b, const char *key, bool v)
{
	json_builder_set_member_name(b, key);
	json_builder_add_boolean_value(b, v);
}

static void bench_print_header(const struct bench_opts *o)
{
	bench_emit(o, "%-5s %6s %5s %3s %8s %8s %10s %9s %9s %9s %9s  %-10s %-20s %s\n", "op",
		   "block", "batch", "thr", "samples", "GB/s", "ops/s", "avg_us", "p50_us",
		   "p99_us", "p999_us", "transport", "device", "verified");
}

/* Slices over sends of @r's lanes during the run (sends_known, sends > 0). */
static double bench_slices_per_send(const struct bench_row *r)
{
	uint64_t total = 0;

	for (uint32_t k = 0; k < r->lanes; k++)
		total += r->lane_slices[k];
	return (double)total / (double)r->sends;
}

static void bench_print_row(const struct bench_opts *o, const struct bench_row *r)
{
	double gbps = bench_rate((double)r->bytes, r->seconds) / 1e9;
	double ops = bench_rate((double)r->requests, r->seconds);
	const char *verdict = "-";
	char sz[32];

	if (o->json) {
		g_autoptr(JsonBuilder) b = json_builder_new();

		json_builder_begin_object(b);
		bench_json_str(b, "mode", r->mode);
		bench_json_str(b, "segment", r->segment);
		bench_json_str(b, "opened", r->opened);
		bench_json_str(b, "op", bench_op_str(r->op));
		bench_json_int(b, "block_size", (int64_t)r->block);
		bench_json_int(b, "batch", r->batch);
		bench_json_int(b, "batch_requested", r->batch_requested);
		bench_json_int(b, "threads", r->threads);
		bench_json_int(b, "depth", r->depth);
		bench_json_int(b, "warmup", r->warmup);
		bench_json_str(b, "transport", r->transport);
		bench_json_str(b, "device", r->device);
		bench_json_int(b, "bytes", (int64_t)r->bytes);
		bench_json_int(b, "requests", (int64_t)r->requests);
		bench_json_int(b, "batches", (int64_t)r->batches);
		bench_json_int(b, "samples", (int64_t)r->samples);
		bench_json_dbl(b, "seconds", r->seconds);
		bench_json_dbl(b, "gbps", gbps);
		bench_json_dbl(b, "ops_per_s", ops);
		bench_json_dbl(b, "lat_us_avg", r->lat_avg_us);
		bench_json_dbl(b, "lat_us_p50", r->lat_p50_us);
		bench_json_dbl(b, "lat_us_p99", r->lat_p99_us);
		bench_json_dbl(b, "lat_us_p999", r->lat_p999_us);
		bench_json_dbl(b, "lat_us_max", r->lat_max_us);
		json_builder_set_member_name(b, "lanes");
		if (r->lanes_known)
			json_builder_add_int_value(b, r->lanes);
		else
			json_builder_add_null_value(b);
		json_builder_set_member_name(b, "lanes_used");
		if (r->lanes_known)
			json_builder_add_int_value(b, r->lanes_used);
		else
			json_builder_add_null_value(b);
		json_builder_set_member_name(b, "slices_per_send");
		if (r->sends_known && r->sends)
			json_builder_add_double_value(b, bench_slices_per_send(r));
		else
			json_builder_add_null_value(b);
		bench_json_known(b, "steal_pct", r->steal_pct);
		bench_json_known(b, "cpu_s_initiator", r->cpu_s_initiator);
		bench_json_known(b, "cpu_s_target", r->cpu_s_target);
		bench_json_bool(b, "verify", r->verify);
		bench_json_bool(b, "verified", r->verified);
		bench_json_bool(b, "failed", r->failed);
		bench_json_bool(b, "interrupted", r->interrupted);
		bench_json_str(b, "version", TE_VERSION);
		json_builder_end_object(b);
		bench_json_print(o, b);
		return;
	}
	if (r->failed && !r->verify)
		verdict = "FAILED";
	else if (r->verify)
		verdict = r->verified ? "yes" : "NO";
	bench_emit(o,
		   "%-5s %6s %5" PRIu32 " %3" PRIu32 " %8" PRIu64 " %8.3f %10.0f %9.1f %9.1f %9.1f "
		   "%9.1f  %-10s %-20s %s\n",
		   bench_op_str(r->op), bench_size_str(r->block, sz, sizeof(sz)), r->batch,
		   r->threads, r->samples, gbps, ops, r->lat_avg_us, r->lat_p50_us, r->lat_p99_us,
		   r->lat_p999_us, r->transport[0] ? r->transport : "-",
		   r->device[0] ? r->device : "-", verdict);
}

/*
 * Slices per lane index of transport @tp in a te_engine_stats object, summed over its peers
 * (te-bench talks to one): the transport's "peers" array, each with a "lanes" array of
 * objects with "slices" (tcp's shape). Returns the lane count, 0 when @tp reports no lanes.
 * @sends_out: the lanes' "sends" summed, or -1 when no lane has that member.
 */
static uint32_t bench_lanes_parse(const char *json, const char *tp, uint64_t *slices,
				  int64_t *sends_out)
{
	g_autoptr(JsonParser) parser = json_parser_new();
	JsonObject *root, *t;
	JsonArray *peers;
	uint32_t n = 0;

	memset(slices, 0, BENCH_MAX_LANES * sizeof(*slices));
	*sends_out = -1;
	if (!json || !tp || !*tp || !json_parser_load_from_data(parser, json, -1, NULL) ||
	    !JSON_NODE_HOLDS_OBJECT(json_parser_get_root(parser)))
		return 0;
	root = json_node_get_object(json_parser_get_root(parser));
	if (!json_object_has_member(root, tp) ||
	    !JSON_NODE_HOLDS_OBJECT(json_object_get_member(root, tp)))
		return 0;
	t = json_object_get_object_member(root, tp);
	if (!json_object_has_member(t, "peers") ||
	    !JSON_NODE_HOLDS_ARRAY(json_object_get_member(t, "peers")))
		return 0;
	peers = json_object_get_array_member(t, "peers");
	for (guint i = 0; i < json_array_get_length(peers); i++) {
		JsonNode *pn = json_array_get_element(peers, i);
		JsonObject *po;
		JsonArray *lanes;

		if (!JSON_NODE_HOLDS_OBJECT(pn))
			continue;
		po = json_node_get_object(pn);
		if (!json_object_has_member(po, "lanes") ||
		    !JSON_NODE_HOLDS_ARRAY(json_object_get_member(po, "lanes")))
			continue;
		lanes = json_object_get_array_member(po, "lanes");
		for (guint k = 0; k < json_array_get_length(lanes) && k < BENCH_MAX_LANES; k++) {
			JsonNode *ln = json_array_get_element(lanes, k);
			JsonObject *lo;

			if (!JSON_NODE_HOLDS_OBJECT(ln))
				continue;
			lo = json_node_get_object(ln);
			if (json_object_has_member(lo, "slices"))
				slices[k] += (uint64_t)json_object_get_int_member(lo, "slices");
			if (json_object_has_member(lo, "sends"))
				*sends_out = MAX(*sends_out, 0) +
					     json_object_get_int_member(lo, "sends");
			n = MAX(n, (uint32_t)k + 1);
		}
	}
	return n;
}

/* The engine's stats now (NULL when it cannot tell: the lanes line is left out). */
static char *bench_stats(struct te_engine *e)
{
	char *json = NULL;

	if (te_engine_stats(e, &json) != TE_OK)
		return NULL;
	return json;
}

/* Lanes of @r's transport used between the stats @before and @after. */
static void bench_lanes_collect(struct bench_row *r, const char *before, const char *after)
{
	uint64_t b[BENCH_MAX_LANES], a[BENCH_MAX_LANES];
	int64_t sb, sa;
	uint32_t nb = bench_lanes_parse(before, r->transport, b, &sb);
	uint32_t na = bench_lanes_parse(after, r->transport, a, &sa);

	if (!na || nb > na)
		return;
	r->lanes_known = true;
	r->lanes = na;
	for (uint32_t k = 0; k < na; k++) {
		r->lane_slices[k] = a[k] >= b[k] ? a[k] - b[k] : 0;
		r->lanes_used += r->lane_slices[k] > 0;
	}
	/* Before the run, an unloaded peer reports no lanes: its sends count from 0. */
	if (sa >= 0 && sa >= MAX(sb, 0)) {
		r->sends_known = true;
		r->sends = (uint64_t)(sa - MAX(sb, 0));
	}
}

/*
 * "lanes: 2 of 2 used (slices per lane 50.1%/49.9%; 31.8 per send)", on stderr (the table
 * stays rows only).
 */
static void bench_lanes_print(const struct bench_opts *o, const struct bench_row *r)
{
	g_autoptr(GString) line = NULL;
	uint64_t total = 0;

	if (o->quiet || !r->lanes_known)
		return;
	for (uint32_t k = 0; k < r->lanes; k++)
		total += r->lane_slices[k];
	line = g_string_new(NULL);
	g_string_printf(line, "lanes: %" PRIu32 " of %" PRIu32 " used", r->lanes_used, r->lanes);
	if (total) {
		g_string_append(line, " (slices per lane ");
		for (uint32_t k = 0; k < r->lanes; k++)
			g_string_append_printf(line, "%s%.1f%%", k ? "/" : "",
					       100.0 * (double)r->lane_slices[k] / (double)total);
		if (r->sends_known && r->sends)
			g_string_append_printf(line, "; %.1f per send", bench_slices_per_send(r));
		g_string_append(line, ")");
	}
	fprintf(stderr, "te-bench: %s\n", line->str);
}

/* Above this much steal, a note says the run's figures are unreliable. */
#define BENCH_STEAL_NOTE_PCT 10.0

static void bench_steal_print(const struct bench_opts *o, double steal_pct)
{
	if (o->quiet || steal_pct < BENCH_STEAL_NOTE_PCT)
		return;
	fprintf(stderr,
		"te-bench: note: the hypervisor took %.0f%% of this machine's CPU time during "
		"the run (steal, /proc/stat): compare only with a baseline measured alongside\n",
		steal_pct);
}

/* A "\r"-rewritten line on a terminal, one line per second elsewhere. */
struct bench_progress {
	bool enabled;
	bool tty;
	bool shown;
	uint64_t start_ns;
	uint64_t last_ns;
};

static void bench_progress_init(struct bench_progress *p, const struct bench_opts *o)
{
	memset(p, 0, sizeof(*p));
	p->enabled = !o->quiet;
	p->tty = isatty(STDERR_FILENO) == 1;
	p->start_ns = bench_now_ns();
}

static void bench_progress_show(struct bench_progress *p, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

static void bench_progress_show(struct bench_progress *p, const char *fmt, ...)
{
	uint64_t now = bench_now_ns();
	g_autofree char *line = NULL;
	va_list ap;

	if (!p->enabled || now - p->start_ns < BENCH_PROGRESS_AFTER_NS ||
	    now - p->last_ns < 1000000000u)
		return;
	p->last_ns = now;
	va_start(ap, fmt);
	line = g_strdup_vprintf(fmt, ap);
	va_end(ap);
	if (p->tty)
		fprintf(stderr, "\r\033[K%s", line);
	else
		fprintf(stderr, "%s\n", line);
	p->shown = true;
}

static void bench_progress_done(struct bench_progress *p)
{
	if (p->shown && p->tty)
		fprintf(stderr, "\r\033[K");
	p->shown = false;
}

/* --- engine and segment -------------------------------------------------------------------- */

static enum te_status bench_engine_new(const char *config, const char *yaml,
				       struct te_engine **engine_out)
{
	struct te_engine_opts opts;

	memset(&opts, 0, sizeof(opts));
	opts.size = sizeof(opts);
	opts.config_path = config;
	if (!config && yaml) {
		opts.config_yaml = yaml;
		opts.config_yaml_len = strlen(yaml);
		opts.config_name = "<te-bench --core>";
	}
	opts.log_level = -1;
	return te_engine_new(&opts, engine_out);
}

/* The largest buffer of @seg that peers may both read and write. */
static bool bench_pick_buffer(struct te_engine *e, te_segment_id seg, const char *name,
			      struct te_buffer_info *out)
{
	g_autofree struct te_buffer_info *bufs = NULL;
	size_t n = 0, total = 0;
	enum te_status st;
	bool found = false;

	st = te_segment_buffers(e, seg, NULL, 0, &total);
	if (st != TE_OK) {
		bench_te_err("te_segment_buffers", st);
		return false;
	}
	bufs = g_new0(struct te_buffer_info, total ? total : 1);
	st = te_segment_buffers(e, seg, bufs, total, &n);
	if (st != TE_OK) {
		bench_te_err("te_segment_buffers", st);
		return false;
	}
	for (size_t i = 0; i < MIN(n, total); i++) {
		if ((bufs[i].access & TE_MEM_REMOTE) != TE_MEM_REMOTE)
			continue;
		if (!found || bufs[i].length > out->length)
			*out = bufs[i];
		found = true;
	}
	if (!found)
		bench_err("segment '%s' publishes no buffer that peers may read and write "
			  "(%zu buffers); start it with te-bench --target",
			  name, n);
	return found;
}

/* --- start gate ---------------------------------------------------------------------------- */

/*
 * Holds worker threads until all are created, then releases them together (or aborts them);
 * then, once each has warmed up, starts their timed loops together (bench_gate_arrive).
 */
struct bench_gate {
	GMutex lock;
	GCond cond;
	int state;	   /* BENCH_GATE_* */
	uint32_t expected; /* threads that arrive after warming up */
	uint32_t arrived;
};

enum {
	BENCH_GATE_CLOSED,
	BENCH_GATE_GO,
	BENCH_GATE_ABORT,
};

static void bench_gate_init(struct bench_gate *g, uint32_t threads)
{
	g_mutex_init(&g->lock);
	g_cond_init(&g->cond);
	g->state = BENCH_GATE_CLOSED;
	g->expected = threads;
	g->arrived = 0;
}

static void bench_gate_clear(struct bench_gate *g)
{
	g_mutex_clear(&g->lock);
	g_cond_clear(&g->cond);
}

/* True when the workers may start, false when they must return at once. */
static bool bench_gate_wait(struct bench_gate *g)
{
	int state;

	g_mutex_lock(&g->lock);
	while (g->state == BENCH_GATE_CLOSED)
		g_cond_wait(&g->cond, &g->lock);
	state = g->state;
	g_mutex_unlock(&g->lock);
	return state == BENCH_GATE_GO;
}

static void bench_gate_open(struct bench_gate *g, bool go)
{
	g_mutex_lock(&g->lock);
	g->state = go ? BENCH_GATE_GO : BENCH_GATE_ABORT;
	g_cond_broadcast(&g->cond);
	g_mutex_unlock(&g->lock);
}

/*
 * After the gate let the threads go (all were created): wait until every thread has arrived
 * (warmed up, or given up), so the timed loops start together. Every released thread arrives
 * exactly once, failed or not, so none waits forever.
 */
static void bench_gate_arrive(struct bench_gate *g)
{
	g_mutex_lock(&g->lock);
	if (++g->arrived >= g->expected)
		g_cond_broadcast(&g->cond);
	while (g->arrived < g->expected)
		g_cond_wait(&g->cond, &g->lock);
	g_mutex_unlock(&g->lock);
}

/* --- initiator ----------------------------------------------------------------------------- */

/* State shared by the threads of one initiator. */
struct bench_init {
	const struct bench_opts *o;
	struct te_engine *e;
	te_segment_id seg;
	uint64_t raddr; /* target buffer */
	uint64_t rlen;
	uint64_t rhalf; /* start of the write zone, relative to raddr */
	uint8_t *local;
	uint64_t llen;
	int64_t timeout_ns;

	/* The current run. */
	enum bench_op op;
	uint64_t block;
	uint32_t batch;
	uint32_t threads;
	uint64_t duration_ns; /* 0: none */
	uint64_t salt_base;   /* random per run: WRITE data never repeats an earlier run's */
	pid_t target_pid;     /* --loopback's target process (0: none of ours) */
	/* CPU seconds of this process and of the target when the timed loops began (< 0: none). */
	double cpu0_initiator, cpu0_target;

	struct bench_gate gate;
	atomic_bool stop;
	atomic_uint finished;
};

struct bench_worker {
	struct bench_init *c;
	uint32_t idx;
	GThread *thread;
	struct te_request *rd;	/* READ of this thread's read-zone range into the data area */
	struct te_request *wr;	/* WRITE of the data area to the write-zone range */
	struct te_request *chk; /* READ of the write-zone range into the read-back area */
	uint8_t *data;
	uint8_t *back;
	uint64_t roff; /* this thread's range in the read zone, relative to raddr */
	uint64_t woff; /* ... and in the write zone */
	struct bench_lat lat;
	atomic_uint_fast64_t progress_bytes; /* read by the progress line; relaxed */
	uint64_t bytes;
	uint64_t requests;
	uint64_t batches;
	uint64_t t_start;
	uint64_t t_end;
	bool failed;
	bool have_info;
	char transport[BENCH_NAME_MAX];
	char device[BENCH_NAME_MAX];
};

static const char *bench_te_op_str(enum te_opcode op)
{
	return op == TE_OP_READ ? "READ" : "WRITE";
}

/* Explain a failed batch: the status, and the first tasks that did not complete. */
static void bench_report_batch(struct bench_worker *w, te_batch_id b, const struct te_request *reqs,
			       uint32_t n, enum te_status st, const char *detail)
{
	struct te_engine *e = w->c->e;
	struct te_task_info ti;
	uint32_t bad = 0;
	char sz[32];

	bench_err("thread %" PRIu32 ": batch of %" PRIu32 " %s requests failed: %s (%d)%s%s",
		  w->idx, n, bench_te_op_str(reqs[0].opcode), te_status_str(st), st,
		  detail[0] ? ": " : "", detail);
	for (uint32_t k = 0; k < n; k++) {
		if (te_task_status(e, b, k, &ti) != TE_OK || ti.state == TE_STATE_COMPLETED)
			continue;
		if (bad++ >= 3)
			continue;
		ti.detail[sizeof(ti.detail) - 1] = '\0';
		bench_err("  task %" PRIu32 ": %s %s at remote 0x%" PRIx64 ": %s, %s (%d)%s%s "
			  "[transport %s, device %s, %" PRIu64 "/%" PRIu64 " bytes, %" PRIu32
			  " slices, %" PRIu32 " retries]",
			  k, bench_te_op_str(reqs[k].opcode),
			  bench_size_str(reqs[k].length, sz, sizeof(sz)), reqs[k].remote,
			  te_state_str(ti.state), te_status_str(ti.status), ti.status,
			  ti.detail[0] ? ": " : "", ti.detail,
			  ti.transport && ti.transport[0] ? ti.transport : "-",
			  ti.device && ti.device[0] ? ti.device : "-", ti.bytes, ti.length,
			  ti.slices, ti.retries);
	}
	if (bad > 3)
		bench_err("  ... and %" PRIu32 " more tasks that did not complete", bad - 3);
}

/* A batch started by bench_batch_start and not finished yet. */
struct bench_pending {
	te_batch_id b;
	const struct te_request *reqs;
	uint32_t n;
	enum te_status st; /* of te_batch_submit */
	char *detail;	   /* te_last_error() after a failed submit */
	uint64_t t0;
};

/* New and submit: TE_OK, or the te_batch_new failure (nothing to finish then). */
static enum te_status bench_batch_start(struct bench_worker *w, const struct te_request *reqs,
					uint32_t n, struct bench_pending *p)
{
	struct bench_init *c = w->c;
	enum te_status st;

	p->reqs = reqs;
	p->n = n;
	p->detail = NULL;
	p->t0 = bench_now_ns();
	st = te_batch_new(c->e, n, &p->b);
	if (st != TE_OK) {
		bench_te_err("te_batch_new", st);
		return st;
	}
	p->st = te_batch_submit(c->e, p->b, reqs, n);
	if (p->st != TE_OK)
		p->detail = g_strdup(te_last_error());
	return TE_OK;
}

/* Wait (cancel past the timeout), report, free. TE_OK iff every task completed. */
static enum te_status bench_batch_finish(struct bench_worker *w, struct bench_pending *p)
{
	struct bench_init *c = w->c;
	g_autofree char *detail = p->detail;
	struct te_task_info ti;
	enum te_status st = p->st, wst, fst;
	te_batch_id b = p->b;

	p->detail = NULL;
	/* Rejected requests became INVALID tasks; the others run and must end first. */
	wst = te_batch_wait(c->e, b, c->timeout_ns);
	if (wst == TE_INPROGRESS) {
		bench_err("thread %" PRIu32 ": batch not finished after %.0f s; canceling it",
			  w->idx, (double)c->timeout_ns / 1e9);
		wst = te_batch_cancel(c->e, b);
		if (wst != TE_OK)
			bench_te_err("te_batch_cancel", wst);
		wst = te_batch_wait(c->e, b, c->timeout_ns);
		if (wst == TE_OK || wst == TE_INPROGRESS)
			wst = TE_ERR_TIMEOUT;
	}
	if (st == TE_OK && wst != TE_OK) {
		st = wst;
		detail = g_strdup(te_last_error());
	}
	if (!w->have_info && te_task_status(c->e, b, 0, &ti) == TE_OK && ti.transport &&
	    ti.transport[0]) {
		/* Copied now: te.h does not promise how long the device text lives. */
		g_strlcpy(w->transport, ti.transport, sizeof(w->transport));
		g_strlcpy(w->device, ti.device ? ti.device : "", sizeof(w->device));
		w->have_info = true;
	}
	if (st != TE_OK)
		bench_report_batch(w, b, p->reqs, p->n, st, detail ? detail : "");
	fst = te_batch_free(c->e, b);
	if (fst != TE_OK) {
		bench_te_err("te_batch_free", fst);
		if (st == TE_OK)
			st = fst;
	}
	return st;
}

/* One batch: new, submit, wait (cancel past the timeout), free. TE_OK iff all completed. */
static enum te_status bench_batch(struct bench_worker *w, const struct te_request *reqs, uint32_t n)
{
	struct bench_pending p;
	enum te_status st = bench_batch_start(w, reqs, n, &p);

	return st != TE_OK ? st : bench_batch_finish(w, &p);
}

static void bench_verify_failed(struct bench_worker *w, const char *what, uint8_t got,
				uint64_t zone_off, uint64_t at, uint64_t salt)
{
	uint64_t block = w->c->block;

	bench_err("thread %" PRIu32 ": verify failed after %s: remote offset 0x%" PRIx64
		  " (request %" PRIu64 ", byte %" PRIu64 "): got 0x%02x, want 0x%02x",
		  w->idx, what, zone_off + at, at / block, at % block, got,
		  pattern_byte(zone_off + at, salt));
}

/* Salt of the data a WRITE sends in iteration @i: differs between iterations and runs. */
static uint64_t bench_write_salt(const struct bench_init *c, uint64_t i)
{
	return pattern_salt(c->salt_base + i + 1);
}

/* Check the data a batch of iteration @i moved; for WRITE, read it back first. */
static bool bench_worker_verify(struct bench_worker *w, bool wr, uint64_t i)
{
	struct bench_init *c = w->c;
	const char *loc = c->o->local_location;
	uint64_t bb = c->block * c->batch;
	uint64_t at;
	uint8_t got = 0;

	if (!wr) {
		at = bench_check_at(c->e, loc, w->data, w->roff, bb, 0, &got);
		if (at == bb)
			return true;
		bench_verify_failed(w, "READ", got, w->roff, at, 0);
		return false;
	}
	if (!bench_put(c->e, loc, w->back, 0, bb, UINT64_MAX, BENCH_POISON))
		return false;
	if (bench_batch(w, w->chk, c->batch) != TE_OK)
		return false;
	at = bench_check_at(c->e, loc, w->back, w->woff, bb, bench_write_salt(c, i), &got);
	if (at == bb)
		return true;
	bench_verify_failed(w, "WRITE and read-back", got, w->woff, at, bench_write_salt(c, i));
	return false;
}

/*
 * --depth N: keep N batches in flight (the next ones are submitted before the oldest is
 * waited for), so that the pipe never drains at a batch boundary. Each batch in flight has
 * its own local and remote areas, as distinct blocks (KV pages) would: 128 READs in flight
 * into one 16 MiB area ran a median 8% slower than into 128 MiB, for the raw libfabric loop too.
 * No --verify here: it checks one batch area per thread.
 */
static void bench_worker_pipelined(struct bench_worker *w, uint64_t deadline)
{
	struct bench_init *c = w->c;
	const struct bench_opts *o = c->o;
	uint64_t bb = c->block * c->batch;
	struct bench_pending q[BENCH_MAX_DEPTH];
	uint32_t head = 0, inflight = 0;
	uint64_t started = 0;

	for (;;) {
		bool more = !w->failed && !bench_signalled &&
			    !atomic_load_explicit(&c->stop, memory_order_relaxed) &&
			    (o->iterations < 0 || started < (uint64_t)o->iterations) &&
			    bench_now_ns() < deadline;
		struct bench_pending *p;
		uint64_t now;

		while (more && inflight < o->depth) {
			bool wr =
				c->op == BENCH_OP_WRITE || (c->op == BENCH_OP_MIX && (started & 1));

			uint32_t slot = (head + inflight) % o->depth;

			p = &q[slot];
			/* Each slot has its own areas, like distinct blocks in flight. */
			if (bench_batch_start(w, (wr ? w->wr : w->rd) + (size_t)slot * c->batch,
					      c->batch, p) != TE_OK) {
				w->failed = true;
				break;
			}
			inflight++;
			started++;
			more = o->iterations < 0 || started < (uint64_t)o->iterations;
		}
		if (!inflight)
			break;
		p = &q[head];
		head = (head + 1) % o->depth;
		inflight--;
		if (bench_batch_finish(w, p) != TE_OK) {
			w->failed = true;
			continue; /* finish the others, start nothing new */
		}
		now = bench_now_ns();
		bench_lat_add(&w->lat, now - p->t0);
		w->batches++;
		w->requests += c->batch;
		w->bytes += bb;
		atomic_fetch_add_explicit(&w->progress_bytes, bb, memory_order_relaxed);
	}
}

/*
 * --warmup: untimed batches of the run's op (MIX alternating), one slot after the other, so
 * connections, registrations and caches are warm before the clock starts. Nothing is counted.
 */
static bool bench_worker_warmup(struct bench_worker *w)
{
	struct bench_init *c = w->c;
	const struct bench_opts *o = c->o;

	for (uint64_t i = 0; i < o->warmup; i++) {
		bool wr = c->op == BENCH_OP_WRITE || (c->op == BENCH_OP_MIX && (i & 1));
		size_t slot = (size_t)(i % o->depth);

		/* Relaxed: as in the timed loop, the flag only asks the loop to end soon. */
		if (atomic_load_explicit(&c->stop, memory_order_relaxed) || bench_signalled)
			break;
		if (bench_batch(w, (wr ? w->wr : w->rd) + slot * c->batch, c->batch) != TE_OK)
			return false;
	}
	return true;
}

static gpointer bench_worker_main(gpointer data)
{
	struct bench_worker *w = data;
	struct bench_init *c = w->c;
	const struct bench_opts *o = c->o;
	uint64_t bb = c->block * c->batch;
	uint64_t now, deadline;

	if (!bench_gate_wait(&c->gate))
		goto out;
	if (!bench_worker_warmup(w)) {
		w->failed = true;
		atomic_store_explicit(&c->stop, true, memory_order_relaxed);
	}
	bench_gate_arrive(&c->gate);
	/* Every thread has warmed up: the timed loops' CPU counts from here. */
	if (w->idx == 0) {
		c->cpu0_initiator = bench_cpu_s(RUSAGE_SELF);
		c->cpu0_target = c->target_pid ? bench_proc_cpu_s(c->target_pid) : -1.0;
	}
	if (w->failed)
		goto end;
	w->t_start = now = bench_now_ns();
	deadline = c->duration_ns ? w->t_start + c->duration_ns : UINT64_MAX;
	if (o->depth > 1) {
		bench_worker_pipelined(w, deadline);
		goto end;
	}
	for (uint64_t i = 0;; i++) {
		bool wr = c->op == BENCH_OP_WRITE || (c->op == BENCH_OP_MIX && (i & 1));
		uint64_t t0;

		/* Relaxed: the flag only asks the loop to end soon; no data rides on it. */
		if (atomic_load_explicit(&c->stop, memory_order_relaxed) || bench_signalled)
			break;
		if (o->iterations >= 0 && i >= (uint64_t)o->iterations)
			break;
		if (now >= deadline)
			break;
		if (o->verify &&
		    !bench_put(c->e, o->local_location, w->data, w->woff, bb,
			       wr ? bench_write_salt(c, i) : UINT64_MAX, BENCH_POISON)) {
			w->failed = true;
			break;
		}
		t0 = bench_now_ns();
		if (bench_batch(w, wr ? w->wr : w->rd, c->batch) != TE_OK) {
			w->failed = true;
			break;
		}
		now = bench_now_ns();
		bench_lat_add(&w->lat, now - t0);
		w->batches++;
		w->requests += c->batch;
		w->bytes += bb;
		atomic_fetch_add_explicit(&w->progress_bytes, bb, memory_order_relaxed);
		if (o->verify && !bench_worker_verify(w, wr, i)) {
			w->failed = true;
			break;
		}
		now = bench_now_ns();
	}
end:
	w->t_end = bench_now_ns();
	if (w->failed)
		atomic_store_explicit(&c->stop, true, memory_order_relaxed);
out:
	atomic_fetch_add_explicit(&c->finished, 1, memory_order_release);
	return NULL;
}

/* Local areas of batch x block per thread: one per batch in flight, or data + check-back. */
static uint64_t bench_local_slots(uint32_t depth)
{
	return depth > 1 ? depth : 2;
}

static void bench_worker_setup(struct bench_worker *w, struct bench_init *c, uint32_t t)
{
	uint64_t bb = c->block * c->batch;
	uint32_t slots = c->o->depth;
	uint32_t cap = MAX(BENCH_MAX_SAMPLES / c->threads, 1024u);

	w->c = c;
	w->idx = t;
	w->data = c->local + bench_local_slots(slots) * bb * t;
	w->back = w->data + bb;
	w->roff = bb * slots * t;
	w->woff = c->rhalf + bb * slots * t;
	/* --depth: one run of requests per batch in flight, on its own local/remote areas */
	w->rd = g_new0(struct te_request, (size_t)slots * c->batch);
	w->wr = g_new0(struct te_request, (size_t)slots * c->batch);
	w->chk = g_new0(struct te_request, c->batch);
	for (uint32_t k = 0; k < slots * c->batch; k++) {
		uint64_t d = (uint64_t)k * c->block;

		w->rd[k] = (struct te_request){ .opcode = TE_OP_READ,
						.segment = c->seg,
						.local = w->data + d,
						.remote = c->raddr + w->roff + d,
						.length = c->block };
		w->wr[k] = (struct te_request){ .opcode = TE_OP_WRITE,
						.segment = c->seg,
						.local = w->data + d,
						.remote = c->raddr + w->woff + d,
						.length = c->block };
		if (k < c->batch)
			w->chk[k] = (struct te_request){ .opcode = TE_OP_READ,
							 .segment = c->seg,
							 .local = w->back + d,
							 .remote = c->raddr + w->woff + d,
							 .length = c->block };
	}
	w->lat.cap = cap;
	w->lat.v = g_new(uint64_t, cap);
	w->lat.rng = UINT64_C(0x9e3779b97f4a7c15) * (t + 1);
	atomic_init(&w->progress_bytes, 0);
}

static void bench_worker_clear(struct bench_worker *w)
{
	g_free(w->rd);
	g_free(w->wr);
	g_free(w->chk);
	g_free(w->lat.v);
}

/* Sum the threads' counters and percentiles into @r. */
static void bench_row_collect(struct bench_row *r, struct bench_worker *ws, uint32_t n)
{
	uint64_t t0 = UINT64_MAX, t1 = 0, seen = 0, sum = 0, max = 0;
	g_autofree uint64_t *all = NULL;
	size_t total = 0, at = 0;

	for (uint32_t t = 0; t < n; t++)
		total += ws[t].lat.n;
	all = g_new(uint64_t, total ? total : 1);
	for (uint32_t t = 0; t < n; t++) {
		struct bench_worker *w = &ws[t];

		r->bytes += w->bytes;
		r->requests += w->requests;
		r->batches += w->batches;
		r->failed |= w->failed;
		if (w->t_start) {
			t0 = MIN(t0, w->t_start);
			t1 = MAX(t1, w->t_end);
		}
		seen += w->lat.seen;
		sum += w->lat.sum_ns;
		max = MAX(max, w->lat.max_ns);
		memcpy(all + at, w->lat.v, w->lat.n * sizeof(*all));
		at += w->lat.n;
		if (!r->transport[0] && w->have_info) {
			g_strlcpy(r->transport, w->transport, sizeof(r->transport));
			g_strlcpy(r->device, w->device, sizeof(r->device));
		}
	}
	r->samples = seen;
	r->seconds = t1 > t0 ? (double)(t1 - t0) / 1e9 : 0.0;
	qsort(all, total, sizeof(*all), bench_cmp_u64);
	r->lat_avg_us = seen ? (double)sum / (double)seen / 1000.0 : 0.0;
	r->lat_p50_us = bench_pct_us(all, total, 0.50);
	r->lat_p99_us = bench_pct_us(all, total, 0.99);
	r->lat_p999_us = bench_pct_us(all, total, 0.999);
	r->lat_max_us = (double)max / 1000.0;
}

/* One run: c->op/block/batch/threads set. Fills @r; false on a failure or interruption. */
static bool bench_run(struct bench_init *c, struct bench_row *r)
{
	const struct bench_opts *o = c->o;
	g_autofree struct bench_worker *ws = g_new0(struct bench_worker, c->threads);
	struct bench_progress prog;
	uint32_t started = 0;
	char sz[32];

	g_autofree char *stats_before = bench_stats(c->e);
	g_autofree char *stats_after = NULL;
	struct steal_mark steal0 = steal_mark_now();

	bench_gate_init(&c->gate, c->threads);
	c->cpu0_initiator = c->cpu0_target = -1.0;
	c->salt_base = (uint64_t)g_random_int() << 32 | g_random_int();
	atomic_store(&c->stop, false);
	atomic_store(&c->finished, 0);
	for (uint32_t t = 0; t < c->threads; t++)
		bench_worker_setup(&ws[t], c, t);
	for (uint32_t t = 0; t < c->threads; t++, started++) {
		g_autoptr(GError) err = NULL;
		char name[16];

		snprintf(name, sizeof(name), "bench-%" PRIu32, t);
		ws[t].thread = g_thread_try_new(name, bench_worker_main, &ws[t], &err);
		if (!ws[t].thread) {
			bench_err("cannot start thread %" PRIu32 ": %s", t, err->message);
			break;
		}
	}
	bench_gate_open(&c->gate, started == c->threads);
	bench_progress_init(&prog, o);
	while (atomic_load_explicit(&c->finished, memory_order_acquire) < started) {
		uint64_t bytes = 0;
		double el;

		g_usleep(50000);
		if (bench_signalled)
			atomic_store_explicit(&c->stop, true, memory_order_relaxed);
		for (uint32_t t = 0; t < started; t++)
			bytes += atomic_load_explicit(&ws[t].progress_bytes, memory_order_relaxed);
		el = (double)(bench_now_ns() - prog.start_ns) / 1e9;
		bench_progress_show(&prog,
				    "te-bench: %s %s x%" PRIu32 " thr %" PRIu32
				    ": %.0f s (of %.0f), %.3f GB/s",
				    bench_op_str(c->op), bench_size_str(c->block, sz, sizeof(sz)),
				    c->batch, c->threads, el, (double)c->duration_ns / 1e9,
				    bench_rate((double)bytes, el) / 1e9);
	}
	bench_progress_done(&prog);
	for (uint32_t t = 0; t < started; t++)
		g_thread_join(ws[t].thread);
	r->steal_pct = steal_pct_since(steal0);
	/* Thread 0 marked the start (joined: its stores are visible); none when it never got there. */
	r->cpu_s_initiator = r->cpu_s_target = -1.0;
	if (c->cpu0_initiator >= 0.0)
		r->cpu_s_initiator = MAX(bench_cpu_s(RUSAGE_SELF) - c->cpu0_initiator, 0.0);
	if (c->cpu0_target >= 0.0) {
		double t1 = bench_proc_cpu_s(c->target_pid);

		if (t1 >= 0.0)
			r->cpu_s_target = MAX(t1 - c->cpu0_target, 0.0);
	}

	r->op = c->op;
	r->block = c->block;
	r->batch = c->batch;
	r->threads = c->threads;
	r->depth = o->depth;
	r->warmup = o->warmup;
	r->verify = o->verify;
	bench_row_collect(r, ws, started);
	stats_after = bench_stats(c->e);
	if (stats_before && stats_after)
		bench_lanes_collect(r, stats_before, stats_after);
	r->failed |= started != c->threads;
	r->interrupted = bench_signalled != 0;
	r->verified = o->verify && !r->failed && !r->interrupted && r->batches > 0;
	for (uint32_t t = 0; t < c->threads; t++)
		bench_worker_clear(&ws[t]);
	bench_gate_clear(&c->gate);
	return !r->failed && !r->interrupted;
}

/* Requests per batch that fit: threads x batch x block must fit in half the target buffer. */
static uint32_t bench_fit_batch(uint64_t half, uint32_t threads, uint64_t block, uint32_t batch)
{
	uint64_t fit = half / ((uint64_t)threads * block);

	return (uint32_t)MIN(fit, (uint64_t)batch);
}

static uint64_t bench_zone_half(uint64_t len)
{
	uint64_t half = len / 2;

	/* Page-align the write zone when the buffer is big enough to care. */
	return half >= 8192 ? half & ~UINT64_C(4095) : half;
}

/*
 * Open @segment by name; when that fails and the target's descriptor is at hand (--loopback),
 * import the descriptor instead, so a run works without a metadata backend.
 */
static bool bench_open_segment(struct bench_init *c, const char *segment, const char *descriptor,
			       const char **opened)
{
	enum te_status st, ist;
	g_autofree char *why = NULL;

	st = te_segment_open(c->e, segment, &c->seg);
	if (st == TE_OK) {
		*opened = "name";
		return true;
	}
	why = g_strdup(te_last_error());
	if (!descriptor) {
		bench_err("cannot open segment '%s': %s (%d)%s%s", segment, te_status_str(st), st,
			  why[0] ? ": " : "", why);
		return false;
	}
	ist = te_segment_import(c->e, descriptor, strlen(descriptor), &c->seg);
	if (ist != TE_OK) {
		bench_err("cannot open segment '%s': %s (%d)%s%s", segment, te_status_str(st), st,
			  why[0] ? ": " : "", why);
		bench_te_err("nor import its descriptor: te_segment_import", ist);
		return false;
	}
	bench_note(c->o, "te_segment_open('%s') failed (%s: %s); imported the target's descriptor",
		   segment, te_status_str(st), why);
	*opened = "descriptor";
	return true;
}

static int bench_initiator(const struct bench_opts *o, const char *mode, const char *segment,
			   const char *descriptor, pid_t target_pid)
{
	struct bench_init c;
	struct te_buffer_info rb;
	const char *opened = "name";
	uint64_t need = 0;
	bool header = false, opened_seg = false, registered = false;
	int rc = BENCH_EXIT_FAIL;
	enum te_status st;
	char sz[32], sz2[32];

	memset(&c, 0, sizeof(c));
	c.o = o;
	c.target_pid = target_pid;
	c.threads = o->threads;
	c.timeout_ns = (int64_t)(o->timeout_s * 1e9);

	st = bench_engine_new(o->config, NULL, &c.e);
	if (st != TE_OK) {
		bench_te_err("cannot create the engine", st);
		goto out;
	}
	if (!bench_open_segment(&c, segment, descriptor, &opened))
		goto out_engine;
	opened_seg = true;
	memset(&rb, 0, sizeof(rb));
	if (!bench_pick_buffer(c.e, c.seg, segment, &rb))
		goto out_segment;
	c.raddr = rb.addr;
	c.rlen = rb.length;
	c.rhalf = bench_zone_half(rb.length);

	for (uint32_t i = 0; i < o->n_sizes; i++) {
		for (uint32_t j = 0; j < o->n_batches; j++) {
			uint64_t size = o->sizes[i];
			uint32_t b = bench_fit_batch(c.rhalf, o->threads * o->depth, size,
						     o->batches[j]);

			need = MAX(need,
				   (uint64_t)o->threads * bench_local_slots(o->depth) * b * size);
		}
	}
	if (!need) {
		bench_err("%s-byte blocks do not fit: each thread needs 2 x depth x batch x block "
			  "bytes of the target buffer (%s bytes at 0x%" PRIx64 "); use a smaller "
			  "--block-size, --threads or --depth, or a larger target --buffer-size",
			  bench_size_str(o->sizes[0], sz, sizeof(sz)),
			  bench_size_str(rb.length, sz2, sizeof(sz2)), rb.addr);
		goto out_segment;
	}
	c.llen = need;
	c.local = bench_alloc(c.e, o->local_location, c.llen);
	if (!c.local)
		goto out_segment;
	/* Touch every page now: first touch is slow here and must not land in a timed run. */
	if (!bench_put(c.e, o->local_location, c.local, 0, c.llen, UINT64_MAX, 0))
		goto out_local;
	st = te_mem_register(c.e, c.local, c.llen, o->local_location ? o->local_location : "cpu",
			     TE_MEM_LOCAL);
	if (st != TE_OK) {
		bench_te_err("te_mem_register (local buffer)", st);
		goto out_local;
	}
	registered = true;

	rc = BENCH_EXIT_OK;
	/* Ops innermost: READ and WRITE of a size run back to back, under the same load. */
	for (uint32_t run = 0; run < o->n_sizes * o->n_batches * o->n_ops; run++) {
		uint64_t size = o->sizes[run / (o->n_batches * o->n_ops)];
		uint32_t asked = o->batches[run / o->n_ops % o->n_batches];
		enum bench_op op = o->ops[run % o->n_ops];
		uint32_t b = bench_fit_batch(c.rhalf, o->threads * o->depth, size, asked);
		struct bench_row r;

		if (bench_signalled || rc != BENCH_EXIT_OK)
			break;
		if (b == 0) {
			/* Once per size and batch, not once per op. */
			if (run % o->n_ops == 0)
				bench_note(o,
					   "skipping %s: %" PRIu32 " thread(s) x depth %" PRIu32
					   " x 2 x block do not fit the target buffer (%s)",
					   bench_size_str(size, sz, sizeof(sz)), o->threads,
					   o->depth, bench_size_str(rb.length, sz2, sizeof(sz2)));
			continue;
		}
		if (b < asked && run % o->n_ops == 0)
			bench_note(o,
				   "%s: batch reduced from %" PRIu32 " to %" PRIu32
				   " to fit the target buffer (%s)",
				   bench_size_str(size, sz, sizeof(sz)), asked, b,
				   bench_size_str(rb.length, sz2, sizeof(sz2)));
		c.op = op;
		c.block = size;
		c.batch = b;
		c.duration_ns = o->duration_s > 0 ? (uint64_t)(o->duration_s * 1e9) : 0;
		memset(&r, 0, sizeof(r));
		r.mode = mode;
		r.segment = segment;
		r.opened = opened;
		r.batch_requested = asked;
		if (!header && !o->json) {
			bench_print_header(o);
			header = true;
		}
		if (!bench_run(&c, &r))
			rc = r.interrupted && !r.failed ? BENCH_EXIT_SIGNAL : BENCH_EXIT_FAIL;
		bench_print_row(o, &r);
		bench_lanes_print(o, &r);
		bench_steal_print(o, r.steal_pct);
	}
	if (bench_signalled && rc == BENCH_EXIT_OK)
		rc = BENCH_EXIT_SIGNAL;

	if (registered) {
		st = te_mem_unregister(c.e, c.local);
		if (st != TE_OK)
			bench_te_err("te_mem_unregister (local buffer)", st);
	}
out_local:
	bench_release(c.e, o->local_location, c.local, c.llen);
out_segment:
	if (opened_seg) {
		st = te_segment_close(c.e, c.seg);
		if (st != TE_OK)
			bench_te_err("te_segment_close", st);
	}
out_engine:
	te_engine_free(c.e);
out:
	return rc;
}

/* --- target -------------------------------------------------------------------------------- */

/*
 * What ends a target besides a signal: EOF on stdin, whatever stdin is (a pipe whose writer
 * closed it, a file read to its end, /dev/null, Ctrl-D on a terminal). Whatever arrives
 * before the EOF is read and dropped. Not watched: --ignore-stdin, a closed or unreadable
 * stdin (nohup's), and a terminal while we are in the background (reading it would stop us
 * with SIGTTIN).
 */
struct bench_stdin {
	const struct bench_opts *o;
	bool watch;
	bool tty;
};

static void bench_stdin_init(struct bench_stdin *s, const struct bench_opts *o)
{
	struct stat sb;

	s->o = o;
	s->watch = !o->ignore_stdin && fstat(STDIN_FILENO, &sb) == 0;
	s->tty = s->watch && isatty(STDIN_FILENO) == 1;
}

/* Wait up to @timeout_ms (0: just look) for input; true once stdin has reached its end. */
static bool bench_stdin_ended(struct bench_stdin *s, int timeout_ms)
{
	struct pollfd pfd = { .fd = STDIN_FILENO, .events = POLLIN };
	char buf[4096];
	ssize_t got;
	bool watch = s->watch;
	int n;

	if (watch && s->tty) {
		pid_t fg = tcgetpgrp(STDIN_FILENO);

		/* -1: not our controlling terminal, so reading it cannot stop us. */
		watch = fg == -1 || fg == getpgrp();
	}
	n = poll(watch ? &pfd : NULL, watch ? 1 : 0, timeout_ms);
	if (n <= 0 || !watch)
		return false;
	if (pfd.revents & POLLNVAL) {
		s->watch = false;
		return false;
	}
	got = read(STDIN_FILENO, buf, sizeof(buf));
	if (got > 0 || (got < 0 && (errno == EINTR || errno == EAGAIN)))
		return false;
	if (got < 0 && (errno == EBADF || errno == EINVAL || errno == EISDIR)) {
		bench_note(s->o, "stdin is not readable (%s): serving until SIGINT/SIGTERM",
			   g_strerror(errno));
		s->watch = false;
		return false;
	}
	return true; /* EOF, or a terminal that went away (EIO) */
}

/* Serve until a signal or the end of stdin. */
static void bench_serve(struct bench_stdin *in)
{
	while (!bench_signalled && !bench_stdin_ended(in, 250))
		;
}

/*
 * Lay the target's pattern over [0, len) in chunks, looking at stdin between them: a parent
 * that gives up during a long fill (or `< /dev/null`) ends the target without waiting for it.
 * False when the fill failed; *ended_out says whether a signal or EOF cut it short.
 */
static bool bench_target_fill(const struct bench_opts *o, struct te_engine *e, uint8_t *buf,
			      uint64_t len, struct bench_stdin *in, bool *ended_out)
{
	const char *loc = o->target_file ? NULL : o->location;

	*ended_out = false;
	for (uint64_t at = 0; at < len; at += BENCH_FILL_CHUNK) {
		if (bench_signalled || bench_stdin_ended(in, 0)) {
			*ended_out = true;
			return true;
		}
		if (!bench_put(e, loc, buf + at, at, MIN(len - at, BENCH_FILL_CHUNK), 0, 0))
			return false;
	}
	return true;
}

/*
 * stdout protocol: "segment: NAME" and "descriptor: BASE64" as soon as the buffer is
 * registered, before it is filled (filling 1 GiB takes seconds here), then "ready" once the
 * pattern is in place. An initiator (--loopback does) waits for "ready": --verify checks
 * READs against that pattern, and a fill running next to the initiator distorts its rates.
 */
static int bench_target(const struct bench_opts *o)
{
	uint64_t len = o->buffer_size ? o->buffer_size : BENCH_DEF_TARGET_BUFFER;
	g_autofree char *json = NULL, *b64 = NULL;
	struct te_engine *e = NULL;
	struct bench_stdin in;
	size_t json_len = 0;
	uint8_t *buf = NULL;
	int rc = BENCH_EXIT_FAIL;
	enum te_status st;
	bool ended = false;
	uint64_t t0;
	char *raw = NULL;
	char sz[32];

	bench_stdin_init(&in, o);
	st = bench_engine_new(o->config, NULL, &e);
	if (st != TE_OK) {
		bench_te_err("cannot create the engine", st);
		return BENCH_EXIT_FAIL;
	}
	buf = o->target_file ? bench_map_file(o->target_file, len)
			     : bench_alloc(e, o->location, len);
	if (!buf)
		goto out_engine;
	st = te_mem_register(e, buf, len, o->location ? o->location : "cpu", TE_MEM_REMOTE);
	if (st != TE_OK) {
		bench_te_err("te_mem_register (target buffer)", st);
		goto out_buf;
	}
	st = te_segment_export(e, &raw, &json_len);
	if (st != TE_OK) {
		bench_te_err("te_segment_export", st);
		goto out_unregister;
	}
	json = g_strndup(raw, json_len);
	te_free(raw);
	b64 = g_base64_encode((const guchar *)json, json_len);

	printf("segment: %s\n", te_engine_name(e));
	printf("descriptor: %s\n", b64);
	if (fflush(stdout) != 0) {
		bench_err("cannot write to stdout: %s", g_strerror(errno));
		goto out_unregister;
	}
	t0 = bench_now_ns();
	/* Touches every page (first touch is slow here) and lays down the target's pattern. */
	if (!bench_target_fill(o, e, buf, len, &in, &ended))
		goto out_unregister;
	if (ended) {
		bench_note(o, "target: %s before the buffer was filled; exiting",
			   bench_signalled ? "signalled" : "EOF on stdin");
		rc = BENCH_EXIT_OK; /* as when the same ends the serving */
		goto out_unregister;
	}
	bench_note(o, "target: filled %s bytes in %.2f s", bench_size_str(len, sz, sizeof(sz)),
		   (double)(bench_now_ns() - t0) / 1e9);
	printf("ready\n");
	if (fflush(stdout) != 0) {
		bench_err("cannot write to stdout: %s", g_strerror(errno));
		goto out_unregister;
	}
	bench_note(o, "target %s serving %s bytes at %p; stop with Ctrl-C, SIGTERM%s",
		   te_engine_name(e), bench_size_str(len, sz, sizeof(sz)), (void *)buf,
		   !in.watch ? ""
		   : in.tty  ? " or EOF on stdin (Ctrl-D)"
			     : " or EOF on stdin");
	bench_serve(&in);
	rc = BENCH_EXIT_OK;

out_unregister:
	st = te_mem_unregister(e, buf);
	if (st != TE_OK)
		bench_te_err("te_mem_unregister (target buffer)", st);
out_buf:
	if (o->target_file)
		bench_unmap(buf, len);
	else
		bench_release(e, o->location, buf, len);
out_engine:
	te_engine_free(e);
	return rc;
}

/* --- loopback: a target child process ------------------------------------------------------ */

/* Read one line (without '\n') from @fd into *line_out, buffering in @acc; false on EOF/timeout. */
static bool bench_read_line(int fd, GString *acc, char **line_out, uint64_t deadline_ns)
{
	for (;;) {
		char *nl = memchr(acc->str, '\n', acc->len);
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		uint64_t now = bench_now_ns();
		char buf[4096];
		ssize_t got;
		int n;

		if (nl) {
			*line_out = g_strndup(acc->str, (gsize)(nl - acc->str));
			g_string_erase(acc, 0, nl - acc->str + 1);
			return true;
		}
		if (now >= deadline_ns || bench_signalled)
			return false;
		n = poll(&pfd, 1, (int)MIN((deadline_ns - now) / 1000000 + 1, (uint64_t)250));
		if (n < 0 && errno != EINTR)
			return false;
		if (n <= 0)
			continue;
		got = read(fd, buf, sizeof(buf));
		if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN))
			return false;
		if (got > 0)
			g_string_append_len(acc, buf, got);
		/* A target prints two short lines; anything this long is not one. */
		if (acc->len > (64u << 20))
			return false;
	}
}

/* Wait for @pid to exit; after @timeout_ns, SIGTERM and then SIGKILL it. Its exit code or -1. */
static int bench_reap(GPid pid, uint64_t timeout_ns)
{
	uint64_t deadline = bench_now_ns() + timeout_ns;
	int status = 0, sig = 0;
	pid_t r;

	for (;;) {
		r = waitpid(pid, &status, WNOHANG);
		if (r == pid)
			break;
		if (r < 0 && errno != EINTR)
			return -1;
		if (bench_now_ns() >= deadline) {
			sig = sig == 0 ? SIGTERM : SIGKILL;
			bench_err("the target process %d did not exit; sending %s", (int)pid,
				  sig == SIGTERM ? "SIGTERM" : "SIGKILL");
			kill(pid, sig);
			deadline = bench_now_ns() + 2 * UINT64_C(1000000000);
		}
		g_usleep(10000);
	}
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		bench_err("the target process %d was killed by signal %d", (int)pid,
			  WTERMSIG(status));
	return -1;
}

/* MemAvailable of /proc/meminfo in bytes; 0 when unknown. */
static uint64_t bench_mem_available(void)
{
	g_autofree char *text = NULL;
	const char *line;
	unsigned long long kib;

	if (!g_file_get_contents("/proc/meminfo", &text, NULL, NULL))
		return 0;
	line = strstr(text, "MemAvailable:");
	if (!line || sscanf(line, "MemAvailable: %llu kB", &kib) != 1)
		return 0;
	return (uint64_t)kib * 1024;
}

/*
 * Target buffer for --loopback: room for the largest run (both halves of every thread's
 * batches in flight, each run's areas distinct), at least 64 MiB; beyond 256 MiB only while it
 * fits in a third of MemAvailable, said in a note. A run that still does not fit runs at a
 * smaller batch, with its own note.
 */
static uint64_t bench_loopback_buffer(const struct bench_opts *o)
{
	uint64_t need = 0, cap = BENCH_LOOPBACK_MAX_BUFFER, avail;
	g_autofree char *avail_s = NULL;
	char sz[32], sz2[32];

	if (o->buffer_size)
		return o->buffer_size;
	for (uint32_t i = 0; i < o->n_sizes; i++)
		for (uint32_t j = 0; j < o->n_batches; j++)
			need = MAX(need, 2 * (uint64_t)o->threads * o->depth * o->batches[j] *
							 o->sizes[i] +
						 2 * 4096);
	need = (MAX(need, BENCH_LOOPBACK_MIN_BUFFER) + BENCH_MIB - 1) & ~(BENCH_MIB - 1);
	if (need <= cap)
		return need;
	avail = bench_mem_available();
	avail_s = g_format_size_full(avail, G_FORMAT_SIZE_IEC_UNITS);
	cap = MIN(MAX(cap, (avail / 3) & ~(BENCH_MIB - 1)), BENCH_MAX_BUFFER);
	if (need <= cap) {
		bench_note(
			o,
			"target buffer %s for the largest run (more than the usual 256M: it fits "
			"in a third of the %s available; filling it takes about 4 s per GiB)",
			bench_size_str(need, sz, sizeof(sz)), avail_s);
		return need;
	}
	bench_note(o,
		   "target buffer %s (a third of the %s available) where the largest run needs "
		   "%s: such runs get a smaller batch (--buffer-size sets the buffer)",
		   bench_size_str(cap, sz, sizeof(sz)), avail_s,
		   bench_size_str(need, sz2, sizeof(sz2)));
	return cap;
}

static int bench_loopback(const struct bench_opts *o)
{
	g_autofree char *exe = g_file_read_link("/proc/self/exe", NULL);
	g_autofree char *bufsz = NULL, *name = NULL, *descriptor = NULL;
	g_autoptr(GString) acc = g_string_new(NULL);
	g_autoptr(GPtrArray) argv = g_ptr_array_new();
	g_autoptr(GError) err = NULL;
	uint64_t deadline = bench_now_ns() + BENCH_STARTUP_TIMEOUT_NS;
	uint64_t buffer = bench_loopback_buffer(o);
	int in_fd = -1, out_fd = -1, rc, child;
	bool ready = false;
	char *line = NULL;
	GPid pid;

	bufsz = g_strdup_printf("%" PRIu64, buffer);
	g_ptr_array_add(argv, exe ? exe : (char *)"/proc/self/exe");
	g_ptr_array_add(argv, (char *)"--target");
	g_ptr_array_add(argv, (char *)"--quiet");
	g_ptr_array_add(argv, (char *)"--buffer-size");
	g_ptr_array_add(argv, bufsz);
	if (o->config) {
		g_ptr_array_add(argv, (char *)"--config");
		g_ptr_array_add(argv, (char *)o->config);
	}
	if (o->target_file) {
		g_ptr_array_add(argv, (char *)"--target-file");
		g_ptr_array_add(argv, (char *)o->target_file);
	}
	if (o->location) {
		g_ptr_array_add(argv, (char *)"--location");
		g_ptr_array_add(argv, (char *)o->location);
	}
	g_ptr_array_add(argv, NULL);
	if (!g_spawn_async_with_pipes(NULL, (char **)argv->pdata, NULL, G_SPAWN_DO_NOT_REAP_CHILD,
				      NULL, NULL, &pid, &in_fd, &out_fd, NULL, &err)) {
		bench_err("cannot start the target process: %s", err->message);
		return BENCH_EXIT_FAIL;
	}
	while (!ready && bench_read_line(out_fd, acc, &line, deadline)) {
		if (strcmp(line, "ready") == 0) {
			ready = true;
		} else if (g_str_has_prefix(line, "segment: ") && !name) {
			/* Announced: now the fill, which takes its time on a large buffer. */
			deadline = bench_now_ns() + BENCH_STARTUP_TIMEOUT_NS +
				   (buffer / BENCH_GIB + 1) * BENCH_FILL_TIMEOUT_NS_PER_GIB;
			name = g_strdup(line + strlen("segment: "));
		} else if (g_str_has_prefix(line, "descriptor: ") && !descriptor) {
			gsize n = 0;
			g_autofree guchar *raw = g_base64_decode(line + strlen("descriptor: "), &n);

			descriptor = g_strndup((const char *)raw, n);
		}
		g_free(line);
		line = NULL;
	}
	if (!name || !descriptor || !ready) {
		bench_err("the target process did not %s%s",
			  !name || !descriptor ? "announce its segment"
					       : "say it was ready (filled its buffer)",
			  bench_signalled	       ? " (interrupted)"
			  : bench_now_ns() >= deadline ? " in time"
						       : " (it exited; see its messages above)");
		rc = bench_signalled ? BENCH_EXIT_SIGNAL : BENCH_EXIT_FAIL;
	} else {
		rc = bench_initiator(o, "loopback", name, descriptor, pid);
	}
	/* EOF on its stdin tells the target to finish. */
	close(in_fd);
	child = bench_reap(pid, BENCH_REAP_TIMEOUT_NS);
	close(out_fd);
	g_spawn_close_pid(pid);
	if (child != 0) {
		bench_err("the target process exited with status %d", child);
		if (rc == BENCH_EXIT_OK)
			rc = BENCH_EXIT_FAIL;
	}
	return rc;
}

/* --- core overhead --------------------------------------------------------------------------- */

/* Both engines of --core: the in-process loopback test transport, driven by the waiter. */
static const char bench_core_yaml_fmt[] = "engine:\n"
					  "  name: \"%s\"\n"
					  "transports:\n"
					  "  - name: loopback\n"
					  "    required: true\n"
					  "    options: {progress: manual}\n";

struct bench_core;

struct bench_core_worker {
	struct bench_core *c;
	uint32_t idx;
	GThread *thread;
	struct te_request *rd;
	struct te_request *wr;
	atomic_uint_fast64_t progress_batches; /* read by the progress line; relaxed */
	uint64_t batches;
	uint64_t t_start;
	uint64_t t_end;
	double cpu_s;
	bool failed;
};

struct bench_core {
	const struct bench_opts *o;
	struct te_engine *a; /* initiator */
	struct te_engine *b; /* target */
	te_segment_id seg;
	uint8_t *abuf;
	uint8_t *bbuf;
	uint64_t len;
	struct bench_gate gate;
	atomic_bool stop;
	atomic_uint finished;
};

/* One batch: new, submit, wait, free; false (reported) on any failure. */
static inline bool bench_core_batch(struct bench_core *c, const struct te_request *reqs)
{
	uint32_t n = c->o->batch;
	bool ok = true;
	enum te_status st;
	te_batch_id b;

	st = te_batch_new(c->a, n, &b);
	if (st != TE_OK) {
		bench_te_err("te_batch_new", st);
		return false;
	}
	st = te_batch_submit(c->a, b, reqs, n);
	if (st != TE_OK) {
		bench_te_err("te_batch_submit", st);
		ok = false;
	}
	/* Even after a rejected submit: the accepted tasks run and must end first. */
	st = te_batch_wait(c->a, b, -1);
	if (st != TE_OK && ok) {
		bench_te_err("te_batch_wait", st);
		ok = false;
	}
	st = te_batch_free(c->a, b);
	if (st != TE_OK) {
		bench_te_err("te_batch_free", st);
		ok = false;
	}
	return ok;
}

/* The loop under test: nothing but te calls and their checks. */
static gpointer bench_core_main(gpointer data)
{
	struct bench_core_worker *w = data;
	struct bench_core *c = w->c;
	const struct bench_opts *o = c->o;
	uint64_t deadline = 0, iterations = UINT64_MAX;
	double cpu0;

	if (!bench_gate_wait(&c->gate))
		goto out;
	/* --warmup: untimed, uncounted, before the clocks (and callgrind's difference) start. */
	for (uint64_t i = 0; i < o->warmup && !w->failed; i++) {
		bool wr = o->op == BENCH_OP_WRITE || (o->op == BENCH_OP_MIX && (i & 1));

		if (atomic_load_explicit(&c->stop, memory_order_relaxed) || bench_signalled)
			break;
		w->failed = !bench_core_batch(c, wr ? w->wr : w->rd);
	}
	if (w->failed)
		atomic_store_explicit(&c->stop, true, memory_order_relaxed);
	bench_gate_arrive(&c->gate);
	if (o->iterations >= 0)
		iterations = (uint64_t)o->iterations;
	cpu0 = bench_cpu_s(RUSAGE_THREAD);
	w->t_start = bench_now_ns();
	if (o->duration_s > 0)
		deadline = w->t_start + (uint64_t)(o->duration_s * 1e9);
	for (uint64_t i = 0; i < iterations && !w->failed; i++) {
		bool wr = o->op == BENCH_OP_WRITE || (o->op == BENCH_OP_MIX && (i & 1));

		/* Clock and flags every 16 batches: their cost stays out of the per-slice figure. */
		if ((i & 15) == 0) {
			if (atomic_load_explicit(&c->stop, memory_order_relaxed) || bench_signalled)
				break;
			if (deadline && bench_now_ns() >= deadline)
				break;
		}
		if (!bench_core_batch(c, wr ? w->wr : w->rd)) {
			w->failed = true;
			break;
		}
		w->batches++;
		atomic_store_explicit(&w->progress_batches, w->batches, memory_order_relaxed);
	}
	w->t_end = bench_now_ns();
	w->cpu_s = bench_cpu_s(RUSAGE_THREAD) - cpu0;
	if (w->failed)
		atomic_store_explicit(&c->stop, true, memory_order_relaxed);
out:
	atomic_fetch_add_explicit(&c->finished, 1, memory_order_release);
	return NULL;
}

/* One batch before the timed loop: learn slices per request, transport and device. */
static bool bench_core_probe(struct bench_core *c, const struct te_request *reqs,
			     struct te_task_info *ti)
{
	enum te_status st, fst;
	te_batch_id b;

	st = te_batch_new(c->a, c->o->batch, &b);
	if (st != TE_OK) {
		bench_te_err("te_batch_new", st);
		return false;
	}
	st = te_batch_submit(c->a, b, reqs, c->o->batch);
	if (st == TE_OK)
		st = te_batch_wait(c->a, b, -1);
	if (st != TE_OK)
		bench_te_err("first batch", st);
	if (te_task_status(c->a, b, 0, ti) != TE_OK)
		memset(ti, 0, sizeof(*ti));
	if (st != TE_OK && ti->detail[0])
		bench_err("task 0: %s", ti->detail);
	fst = te_batch_free(c->a, b);
	if (fst != TE_OK) {
		bench_te_err("te_batch_free", fst);
		return false;
	}
	return st == TE_OK;
}

/* After the run: the bytes of the last direction moved must match the pattern. */
static bool bench_core_verify(struct bench_core *c)
{
	const struct bench_opts *o = c->o;
	/* WRITE moved A's data (salt 1) into B; READ and MIX leave B's pattern in both. */
	bool wr = o->op == BENCH_OP_WRITE;
	const uint8_t *p = wr ? c->bbuf : c->abuf;
	uint64_t salt = wr ? pattern_salt(1) : 0;
	uint8_t got = 0;
	uint64_t at = bench_check_at(wr ? c->b : c->a, wr ? o->location : o->local_location, p, 0,
				     c->len, salt, &got);

	if (at == c->len)
		return true;
	bench_err("core: verify failed at offset 0x%" PRIx64 ": got 0x%02x, want 0x%02x", at, got,
		  pattern_byte(at, salt));
	return false;
}

static void bench_core_report(const struct bench_opts *o, const struct te_task_info *ti,
			      uint64_t batches, double seconds, double cpu_s, double proc_cpu_s,
			      double steal_pct, bool verified)
{
	uint64_t requests = batches * o->batch;
	uint64_t slices = requests * (ti->slices ? ti->slices : 1);
	double sps = bench_rate((double)slices, seconds);
	double ns = slices ? seconds * 1e9 / (double)slices : 0.0;
	double spc = bench_rate((double)slices, cpu_s);
	const char *tp = ti->transport && ti->transport[0] ? ti->transport : "loopback";
	const char *dev = ti->device ? ti->device : "";
	char sz[32];

	if (o->json) {
		g_autoptr(JsonBuilder) b = json_builder_new();

		json_builder_begin_object(b);
		bench_json_str(b, "mode", "core");
		bench_json_str(b, "op", bench_op_str(o->op));
		bench_json_int(b, "block_size", (int64_t)o->block);
		bench_json_int(b, "batch", o->batch);
		bench_json_int(b, "threads", o->threads);
		bench_json_str(b, "transport", tp);
		bench_json_str(b, "device", dev);
		bench_json_str(b, "progress", "manual");
		bench_json_int(b, "iterations", (int64_t)batches);
		bench_json_int(b, "samples", (int64_t)batches);
		bench_json_int(b, "warmup", o->warmup);
		bench_json_int(b, "requests", (int64_t)requests);
		bench_json_int(b, "slices_per_request", ti->slices ? ti->slices : 1);
		bench_json_int(b, "slices", (int64_t)slices);
		bench_json_int(b, "bytes", (int64_t)(requests * o->block));
		bench_json_dbl(b, "seconds", seconds);
		bench_json_dbl(b, "cpu_seconds", cpu_s);
		bench_json_dbl(b, "process_cpu_seconds", proc_cpu_s);
		bench_json_dbl(b, "slices_per_s", sps);
		bench_json_dbl(b, "ns_per_slice", ns);
		bench_json_dbl(b, "slices_per_cpu_s", spc);
		bench_json_dbl(b, "gbps", bench_rate((double)(requests * o->block), seconds) / 1e9);
		bench_json_dbl(b, "ops_per_s", bench_rate((double)requests, seconds));
		bench_json_known(b, "steal_pct", steal_pct);
		bench_json_bool(b, "verify", o->verify);
		bench_json_bool(b, "verified", verified);
		bench_json_str(b, "version", TE_VERSION);
		json_builder_end_object(b);
		bench_json_print(o, b);
		return;
	}
	bench_emit(o,
		   "core: %s %s-byte requests x%" PRIu32 ", %" PRIu32 " thread(s), %s (manual "
		   "progress)%s%s\n",
		   bench_op_str(o->op), bench_size_str(o->block, sz, sizeof(sz)), o->batch,
		   o->threads, tp, dev[0] ? ", device " : "", dev);
	bench_emit(o,
		   "  %" PRIu64 " slices (%" PRIu64 " batches = samples, after %" PRIu32
		   " warm-up) in %.3f s: %.3f M slices/s, %.1f ns/slice\n",
		   slices, batches, o->warmup, seconds, sps / 1e6, ns);
	bench_emit(o,
		   "  submitting threads' CPU %.3f s: %.3f M slices per CPU-second (process CPU "
		   "%.3f s)%s\n",
		   cpu_s, spc / 1e6, proc_cpu_s,
		   !o->verify ? ""
		   : verified ? "; verified"
			      : "; VERIFY FAILED");
}

static bool bench_core_setup(struct bench_core *c)
{
	const struct bench_opts *o = c->o;
	g_autofree char *ya = g_strdup_printf(bench_core_yaml_fmt, "te-bench-core-a");
	g_autofree char *yb = g_strdup_printf(bench_core_yaml_fmt, "te-bench-core-b");
	char *json = NULL;
	size_t json_len = 0;
	enum te_status st;

	st = bench_engine_new(o->config, ya, &c->a);
	if (st != TE_OK) {
		bench_te_err("cannot create engine A", st);
		return false;
	}
	st = bench_engine_new(o->config, yb, &c->b);
	if (st != TE_OK) {
		bench_te_err("cannot create engine B", st);
		return false;
	}
	c->len = (uint64_t)o->threads * o->batch * o->block;
	c->abuf = bench_alloc(c->a, o->local_location, c->len);
	c->bbuf = bench_alloc(c->b, o->location, c->len);
	if (!c->abuf || !c->bbuf)
		return false;
	if (!bench_put(c->b, o->location, c->bbuf, 0, c->len, 0, 0) ||
	    !bench_put(c->a, o->local_location, c->abuf, 0, c->len, pattern_salt(1), 0))
		return false;
	st = te_mem_register(c->b, c->bbuf, c->len, o->location ? o->location : "cpu",
			     TE_MEM_REMOTE);
	if (st != TE_OK) {
		bench_te_err("te_mem_register (engine B)", st);
		return false;
	}
	st = te_mem_register(c->a, c->abuf, c->len, o->local_location ? o->local_location : "cpu",
			     TE_MEM_LOCAL);
	if (st != TE_OK) {
		bench_te_err("te_mem_register (engine A)", st);
		return false;
	}
	st = te_segment_export(c->b, &json, &json_len);
	if (st != TE_OK) {
		bench_te_err("te_segment_export (engine B)", st);
		return false;
	}
	st = te_segment_import(c->a, json, json_len, &c->seg);
	te_free(json);
	if (st != TE_OK) {
		bench_te_err("te_segment_import (into engine A)", st);
		return false;
	}
	return true;
}

static int bench_core_run(const struct bench_opts *o)
{
	g_autofree struct bench_core_worker *ws = g_new0(struct bench_core_worker, o->threads);
	uint64_t bb = (uint64_t)o->batch * o->block, batches = 0, t0 = UINT64_MAX, t1 = 0;
	struct bench_progress prog;
	struct bench_core c;
	struct te_task_info ti;
	uint32_t started = 0;
	double cpu = 0.0, pcpu0, pcpu, steal;
	struct steal_mark steal0;
	bool failed = false, verified = false;
	int rc = BENCH_EXIT_FAIL;

	memset(&c, 0, sizeof(c));
	memset(&ti, 0, sizeof(ti));
	c.o = o;
	bench_gate_init(&c.gate, o->threads);
	if (!bench_core_setup(&c))
		goto out;
	for (uint32_t t = 0; t < o->threads; t++) {
		struct bench_core_worker *w = &ws[t];

		w->c = &c;
		w->idx = t;
		w->rd = g_new0(struct te_request, o->batch);
		w->wr = g_new0(struct te_request, o->batch);
		for (uint32_t k = 0; k < o->batch; k++) {
			uint64_t off = bb * t + (uint64_t)k * o->block;

			w->rd[k] = (struct te_request){ .opcode = TE_OP_READ,
							.segment = c.seg,
							.local = c.abuf + off,
							.remote = (uint64_t)(uintptr_t)c.bbuf + off,
							.length = o->block };
			w->wr[k] = w->rd[k];
			w->wr[k].opcode = TE_OP_WRITE;
		}
		atomic_init(&w->progress_batches, 0);
	}
	if (!bench_core_probe(&c, o->op == BENCH_OP_WRITE ? ws[0].wr : ws[0].rd, &ti))
		goto out;
	/* Undo what the probe moved, so verify sees only the loop's work. */
	if (!bench_put(c.b, o->location, c.bbuf, 0, c.len, 0, 0) ||
	    !bench_put(c.a, o->local_location, c.abuf, 0, c.len, pattern_salt(1), 0))
		goto out;

	for (uint32_t t = 0; t < o->threads; t++, started++) {
		g_autoptr(GError) err = NULL;

		ws[t].thread = g_thread_try_new("bench-core", bench_core_main, &ws[t], &err);
		if (!ws[t].thread) {
			bench_err("cannot start thread %" PRIu32 ": %s", t, err->message);
			failed = true;
			break;
		}
	}
	pcpu0 = bench_cpu_s(RUSAGE_SELF);
	steal0 = steal_mark_now();
	bench_gate_open(&c.gate, !failed);
	if (o->duration_s > 0) {
		/* Only timed runs watch; a fixed --iterations run stays quiet for callgrind. */
		bench_progress_init(&prog, o);
		while (atomic_load_explicit(&c.finished, memory_order_acquire) < started) {
			uint64_t n = 0;
			double el;

			g_usleep(50000);
			for (uint32_t t = 0; t < started; t++)
				n += atomic_load_explicit(&ws[t].progress_batches,
							  memory_order_relaxed);
			el = (double)(bench_now_ns() - prog.start_ns) / 1e9;
			bench_progress_show(
				&prog, "te-bench: core: %.0f s of %.0f, %.3f M slices/s", el,
				o->duration_s,
				bench_rate((double)n * o->batch * (ti.slices ? ti.slices : 1), el) /
					1e6);
		}
		bench_progress_done(&prog);
	}
	for (uint32_t t = 0; t < started; t++) {
		g_thread_join(ws[t].thread);
		failed |= ws[t].failed;
		batches += ws[t].batches;
		cpu += ws[t].cpu_s;
		t0 = MIN(t0, ws[t].t_start);
		t1 = MAX(t1, ws[t].t_end);
	}
	pcpu = bench_cpu_s(RUSAGE_SELF) - pcpu0;
	steal = steal_pct_since(steal0);
	if (!failed && o->verify && batches == 0)
		bench_err("core: --verify: no batch ran, nothing to verify");
	else if (!failed && o->verify)
		verified = bench_core_verify(&c);
	bench_core_report(o, &ti, batches, t1 > t0 ? (double)(t1 - t0) / 1e9 : 0.0, cpu, pcpu,
			  steal, verified);
	bench_steal_print(o, steal);
	if (failed || (o->verify && !verified))
		rc = BENCH_EXIT_FAIL;
	else
		rc = bench_signalled ? BENCH_EXIT_SIGNAL : BENCH_EXIT_OK;
out:
	for (uint32_t t = 0; t < o->threads; t++) {
		g_free(ws[t].rd);
		g_free(ws[t].wr);
	}
	/* Device memory goes back through its engine, unregistered first. */
	if (bench_on_device(o->local_location) && c.abuf) {
		if (te_mem_unregister(c.a, c.abuf) == TE_OK)
			bench_release(c.a, o->local_location, c.abuf, c.len);
		c.abuf = NULL;
	}
	if (bench_on_device(o->location) && c.bbuf) {
		if (te_mem_unregister(c.b, c.bbuf) == TE_OK)
			bench_release(c.b, o->location, c.bbuf, c.len);
		c.bbuf = NULL;
	}
	/* Engines first: they may still reference the buffers. */
	te_engine_free(c.a);
	te_engine_free(c.b);
	bench_unmap(c.abuf, c.len);
	bench_unmap(c.bbuf, c.len);
	bench_gate_clear(&c.gate);
	return rc;
}

/* --- command line -------------------------------------------------------------------------- */

static int bench_usage(const char *fmt, ...) G_GNUC_PRINTF(1, 2);

static int bench_usage(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	bench_vmsg("", fmt, ap);
	va_end(ap);
	fprintf(stderr, "te-bench: try --help\n");
	return BENCH_EXIT_USAGE;
}

/* --op: "read", "write", "mix", "both" (read,write), or a comma-separated list of them. */
static bool bench_parse_ops(const char *arg, struct bench_opts *o, char **why_out)
{
	g_auto(GStrv) items = g_strsplit(arg, ",", -1);

	o->n_ops = 0;
	for (char **it = items; *it; it++) {
		enum bench_op add[2];
		uint32_t n = 1;

		if (strcmp(*it, "read") == 0) {
			add[0] = BENCH_OP_READ;
		} else if (strcmp(*it, "write") == 0) {
			add[0] = BENCH_OP_WRITE;
		} else if (strcmp(*it, "mix") == 0) {
			add[0] = BENCH_OP_MIX;
		} else if (strcmp(*it, "both") == 0) {
			add[0] = BENCH_OP_READ;
			add[1] = BENCH_OP_WRITE;
			n = 2;
		} else {
			*why_out = g_strdup_printf(
				"--op: '%s' is not one of read, write, mix, both", *it);
			return false;
		}
		for (uint32_t k = 0; k < n; k++) {
			for (uint32_t j = 0; j < o->n_ops; j++) {
				if (o->ops[j] == add[k]) {
					*why_out =
						g_strdup_printf("--op: %s is listed twice in '%s'",
								bench_op_str(add[k]), arg);
					return false;
				}
			}
			/* Three distinct ops at most, so the duplicate check bounds this. */
			o->ops[o->n_ops++] = add[k];
		}
	}
	if (!o->n_ops) {
		*why_out = g_strdup_printf("--op: empty");
		return false;
	}
	return true;
}

/*
 * --sizes / --batches: comma-separated items, each a value or a range A-B meaning A, 2A,
 * 4A, ... up to B. Values in [1, @max] (@sizes: K/M/G suffixes), at most BENCH_MAX_LIST in all.
 * On failure *why_out is the message (the caller frees it).
 */
static bool bench_parse_list(const char *flag, const char *arg, bool sizes, uint64_t max,
			     uint64_t *out, uint32_t *n_out, char **why_out)
{
	g_auto(GStrv) items = g_strsplit(arg, ",", -1);
	uint32_t n = 0;

	for (char **it = items; *it; it++) {
		g_auto(GStrv) ends = g_strsplit(*it, "-", 3);
		const char *bad = *it; /* the part named in the message */
		uint64_t lo = 0, hi = 0;
		bool ok;

		ok = ends[0] && (!ends[1] || !ends[2]);
		for (int k = 0; ok && k < 2 && ends[k]; k++) {
			uint64_t *v = k ? &hi : &lo;
			char *end = NULL;

			bad = ends[k];
			if (sizes) {
				ok = bench_parse_size(ends[k], v);
			} else {
				errno = 0;
				*v = g_ascii_isdigit(ends[k][0])
					     ? g_ascii_strtoull(ends[k], &end, 10)
					     : 0;
				ok = end && !*end && !errno;
			}
			ok = ok && *v >= 1 && *v <= max;
		}
		if (!ok) {
			*why_out = g_strdup_printf(
				"%s: invalid %s '%s' in '%s' (expected %s, or a range A-B of "
				"A, 2A, 4A ... up to B)",
				flag, sizes ? "size" : "count", bad, arg,
				sizes ? "1 to 4G bytes, e.g. 4K, 64K, 1M" : "1 to 65536");
			return false;
		}
		if (!ends[1])
			hi = lo;
		if (lo > hi) {
			*why_out =
				g_strdup_printf("%s: range '%s' ends below its start", flag, *it);
			return false;
		}
		for (uint64_t v = lo; v <= hi; v *= 2) {
			if (n == BENCH_MAX_LIST) {
				*why_out = g_strdup_printf("%s: '%s' makes more than %d values",
							   flag, arg, BENCH_MAX_LIST);
				return false;
			}
			out[n++] = v;
		}
	}
	if (!n) {
		*why_out = g_strdup_printf("%s: empty", flag);
		return false;
	}
	*n_out = n;
	return true;
}

static int bench_version(void)
{
	printf("te-bench %s (plugin ABI %d.%d)\n", TE_VERSION, TE_PLUGIN_ABI_MAJOR,
	       TE_PLUGIN_ABI_MINOR);
	return fflush(stdout) == 0 ? BENCH_EXIT_OK : BENCH_EXIT_FAIL;
}

/* Parse and validate the command line into @o; BENCH_EXIT_OK or BENCH_EXIT_USAGE. */
static int bench_parse_args(int argc, char **argv, struct bench_opts *o, char **strs)
{
	gboolean target = FALSE, loopback = FALSE, core = FALSE, sweep = FALSE, verify = FALSE;
	gboolean json = FALSE, quiet = FALSE, version = FALSE, ignore_stdin = FALSE;
	gint batch = -1, threads = 1, depth = 1;
	gint64 iterations = -1, warmup = BENCH_DEF_WARMUP;
	gdouble timeout = BENCH_DEF_TIMEOUT;
	char *initiator = NULL, *config = NULL, *op = NULL, *block = NULL, *buffer = NULL;
	char *duration = NULL, *target_file = NULL, *location = NULL, *local_location = NULL;
	char *sizes = NULL, *batches = NULL, *output = NULL;
	uint64_t list[BENCH_MAX_LIST];
	g_autofree char *why = NULL;
	g_autoptr(GOptionContext) octx = NULL;
	g_autoptr(GError) error = NULL;
	uint32_t runs;
	int modes;
	const GOptionEntry entries[] = {
		{ "target", 0, 0, G_OPTION_ARG_NONE, &target,
		  "Serve a pattern-filled buffer: print 'segment: NAME' and 'descriptor: BASE64', "
		  "fill the buffer, print 'ready', serve until SIGINT/SIGTERM or EOF on stdin",
		  NULL },
		{ "initiator", 0, 0, G_OPTION_ARG_STRING, &initiator,
		  "Transfer to and from the target segment SEGMENT", "SEGMENT" },
		{ "loopback", 0, 0, G_OPTION_ARG_NONE, &loopback,
		  "Start a --target child process and run as its initiator", NULL },
		{ "core", 0, 0, G_OPTION_ARG_NONE, &core,
		  "Core overhead: slices/s through the loopback test transport, in-process", NULL },
		{ "config", 'c', 0, G_OPTION_ARG_FILENAME, &config,
		  "Engine configuration (default: $TE_CONFIG, else p2p metadata and tcp on "
		  "loopback; --core: the loopback test transport)",
		  "FILE" },
		{ "op", 'o', 0, G_OPTION_ARG_STRING, &op,
		  "read, write, mix (batches alternate), both (= read,write), or a list: each "
		  "size runs every op listed, one row each [read]",
		  "OP[,OP]" },
		{ "block-size", 'b', 0, G_OPTION_ARG_STRING, &block,
		  "Bytes per request, K/M/G suffixes are powers of 2 [64K; --core: 64]", "SIZE" },
		{ "sizes", 'S', 0, G_OPTION_ARG_STRING, &sizes,
		  "Block sizes to run, one row each: a list (4K,64K,1M) and/or ranges A-B "
		  "(A, 2A, 4A ... up to B: 4K-64M)",
		  "LIST" },
		{ "batch", 'B', 0, G_OPTION_ARG_INT, &batch, "Requests per batch [128; --core: 64]",
		  "N" },
		{ "batches", 0, 0, G_OPTION_ARG_STRING, &batches,
		  "Batch sizes to run for every block size: a list (1,32,128) and/or ranges A-B",
		  "LIST" },
		{ "threads", 't', 0, G_OPTION_ARG_INT, &threads, "Submitting threads [1]", "N" },
		{ "depth", 'D', 0, G_OPTION_ARG_INT, &depth,
		  "Batches each thread keeps in flight: the next are submitted before the oldest "
		  "is waited for [1]",
		  "N" },
		{ "duration", 'd', 0, G_OPTION_ARG_STRING, &duration,
		  "Seconds per run [5; 2 when there are several runs; --core: 3]", "SECONDS" },
		{ "iterations", 'n', 0, G_OPTION_ARG_INT64, &iterations,
		  "Batches per thread instead of a duration (--core: 0 measures the setup alone)",
		  "N" },
		{ "warmup", 'w', 0, G_OPTION_ARG_INT64, &warmup,
		  "Untimed batches per thread before each run; 0: none [8]", "N" },
		{ "sweep", 's', 0, G_OPTION_ARG_NONE, &sweep,
		  "Run block sizes 4K 16K 64K 256K 1M 4M 16M 64M (the default --sizes list)",
		  NULL },
		{ "verify", 'v', 0, G_OPTION_ARG_NONE, &verify,
		  "Check every byte moved against the pattern of its offset", NULL },
		{ "buffer-size", 0, 0, G_OPTION_ARG_STRING, &buffer,
		  "Target buffer [1G; --loopback: what the runs need, 64M up, beyond 256M within a third of MemAvailable]",
		  "SIZE" },
		{ "target-file", 0, 0, G_OPTION_ARG_FILENAME, &target_file,
		  "Map the target buffer from FILE, shared (e.g. a CXL window file or DAX device) "
		  "[anonymous memory]",
		  "FILE" },
		{ "location", 0, 0, G_OPTION_ARG_STRING, &location,
		  "Location the target buffer is registered with, e.g. cxl:0; cuda:N and hip:N "
		  "allocate it with te_mem_alloc [cpu]",
		  "LOC" },
		{ "local-location", 0, 0, G_OPTION_ARG_STRING, &local_location,
		  "Location of the initiator's buffer: cpu, or cuda:N / hip:N (te_mem_alloc; "
		  "--verify reads it back through te_mem_copy) [cpu]",
		  "LOC" },
		{ "timeout", 0, 0, G_OPTION_ARG_DOUBLE, &timeout,
		  "Seconds a batch may take before it is canceled and counted as failed [120]",
		  "SECONDS" },
		{ "json", 'j', 0, G_OPTION_ARG_NONE, &json,
		  "One JSON object per result row on stdout", NULL },
		{ "output", 'O', 0, G_OPTION_ARG_FILENAME, &output,
		  "Also write the result rows (table, or JSON lines with --json) to FILE, "
		  "replacing it",
		  "FILE" },
		{ "ignore-stdin", 0, 0, G_OPTION_ARG_NONE, &ignore_stdin,
		  "--target: serve until SIGINT/SIGTERM only, whatever stdin does (e.g. started "
		  "in the background with stdin on /dev/null)",
		  NULL },
		{ "quiet", 'q', 0, G_OPTION_ARG_NONE, &quiet, "No progress line and no notes",
		  NULL },
		{ "version", 'V', 0, G_OPTION_ARG_NONE, &version,
		  "Print te-bench's te version and plugin ABI, then exit", NULL },
		{ NULL, 0, 0, 0, NULL, NULL, NULL },
	};

	octx = g_option_context_new("- te transfer benchmark");
	g_option_context_set_summary(
		octx,
		"Throughput and latency of te transfers between two processes, and the core's\n"
		"per-slice overhead. Rows: GB/s (10^9 bytes/s), requests/s, batch latency\n"
		"avg/p50/p99/p99.9 in microseconds (every request of a batch counts with its\n"
		"batch's completion time), transport and device of the first task.\n"
		"\n"
		"  te-bench --target [--buffer-size 1G]       prints 'segment: NAME' and\n"
		"      'descriptor: BASE64', fills its buffer, prints 'ready' (start initiators\n"
		"      after it), serves until SIGINT/SIGTERM or EOF on stdin (a pipe closed by its\n"
		"      writer, a file read to its end, /dev/null, Ctrl-D; --ignore-stdin: signals only)\n"
		"  te-bench --initiator NAME [--sweep] [--verify]\n"
		"  te-bench --loopback [--sweep] [--verify]   both in one command\n"
		"  te-bench --loopback --op both --sizes 4K-1M --batches 1,32,128 --json -O rows.json\n"
		"  te-bench --core [--duration 3 | --iterations N]\n"
		"\n"
		"Runs: every size (--block-size, --sizes or --sweep) x batch (--batch or --batches)\n"
		"x op (--op list), ops innermost: READ and WRITE of a size run back to back. Each\n"
		"run starts with --warmup untimed batches per thread; 'samples' counts the timed ones.\n"
		"bench/plot.py turns --json rows into a bandwidth and latency plot.\n"
		"\n"
		"Exit status: 0 ok, 1 a transfer or verification failed, 2 usage error,\n"
		"130 interrupted.");
	g_option_context_add_main_entries(octx, entries, NULL);
	if (!g_option_context_parse(octx, &argc, &argv, &error))
		return bench_usage("%s", error->message);
	strs[0] = initiator;
	strs[1] = config;
	strs[2] = op;
	strs[3] = block;
	strs[4] = buffer;
	strs[5] = duration;
	strs[6] = target_file;
	strs[7] = location;
	strs[8] = local_location;
	strs[9] = sizes;
	strs[10] = batches;
	strs[11] = output;
	if (argc > 1)
		return bench_usage("unexpected argument '%s'", argv[1]);
	if (version)
		return BENCH_EXIT_VERSION;

	modes = !!target + !!initiator + !!loopback + !!core;
	if (modes != 1)
		return bench_usage(
			"choose one of --target, --initiator SEGMENT, --loopback, --core");
	o->mode = target      ? BENCH_MODE_TARGET
		  : initiator ? BENCH_MODE_INITIATOR
		  : loopback  ? BENCH_MODE_LOOPBACK
			      : BENCH_MODE_CORE;
	if (initiator && !initiator[0])
		return bench_usage("--initiator needs a segment name");
	o->segment = initiator;
	o->config = config;
	o->sweep = sweep;
	o->verify = verify;
	o->json = json;
	o->quiet = quiet;

	o->ignore_stdin = ignore_stdin;
	if (ignore_stdin && !target)
		return bench_usage("--ignore-stdin works with --target");

	o->ops[0] = BENCH_OP_READ;
	o->n_ops = 1;
	if (op && !bench_parse_ops(op, o, &why))
		return bench_usage("%s", why);
	o->op = o->ops[0];

	o->block = core ? BENCH_CORE_BLOCK : BENCH_DEF_BLOCK;
	if (block) {
		if (!bench_parse_size(block, &o->block) || o->block == 0 ||
		    o->block > BENCH_MAX_BLOCK)
			return bench_usage(
				"--block-size: invalid size '%s' (expected 1 to 4G bytes, "
				"e.g. 4096, 64K, 1M)",
				block);
		o->block_set = true;
	}
	if ((sweep || sizes || batches) && (core || target))
		return bench_usage("--sweep, --sizes and --batches work with --initiator and "
				   "--loopback");
	if (sweep && sizes)
		return bench_usage("--sweep is the size list 4K-64M by fours; give --sizes or "
				   "--sweep, not both");
	if ((sweep || sizes) && block)
		return bench_usage("--%s picks the block sizes; drop --block-size",
				   sweep ? "sweep" : "sizes");
	if (sweep) {
		o->n_sizes = G_N_ELEMENTS(bench_sweep_sizes);
		memcpy(o->sizes, bench_sweep_sizes, sizeof(bench_sweep_sizes));
	} else if (sizes) {
		if (!bench_parse_list("--sizes", sizes, true, BENCH_MAX_BLOCK, o->sizes,
				      &o->n_sizes, &why))
			return bench_usage("%s", why);
	} else {
		o->sizes[0] = o->block;
		o->n_sizes = 1;
	}
	o->block = o->sizes[0];

	if (batches && batch != -1)
		return bench_usage("give --batch N or --batches LIST, not both");
	if (batch == -1)
		batch = core ? BENCH_CORE_BATCH : BENCH_DEF_BATCH;
	if (batch < 1 || batch > BENCH_MAX_BATCH)
		return bench_usage("--batch: %d is not in [1, %d]", batch, BENCH_MAX_BATCH);
	o->batches[0] = (uint32_t)batch;
	o->n_batches = 1;
	if (batches) {
		if (!bench_parse_list("--batches", batches, false, BENCH_MAX_BATCH, list,
				      &o->n_batches, &why))
			return bench_usage("%s", why);
		for (uint32_t i = 0; i < o->n_batches; i++)
			o->batches[i] = (uint32_t)list[i];
	}
	o->batch = o->batches[0];
	runs = o->n_sizes * o->n_batches * o->n_ops;
	if (threads < 1 || threads > BENCH_MAX_THREADS)
		return bench_usage("--threads: %d is not in [1, %d]", threads, BENCH_MAX_THREADS);
	o->threads = (uint32_t)threads;
	if (depth < 1 || depth > BENCH_MAX_DEPTH)
		return bench_usage("--depth: %d is not in [1, %d]", depth, BENCH_MAX_DEPTH);
	if (depth > 1 && (core || target))
		return bench_usage("--depth works with --initiator and --loopback");
	if (depth > 1 && verify)
		return bench_usage("--depth %d cannot be combined with --verify (it checks one "
				   "batch area per thread)",
				   depth);
	o->depth = (uint32_t)depth;
	/* The --core buffers hold every request of every thread at once. */
	if (core && (uint64_t)o->threads * o->batch * o->block > 64 * BENCH_GIB)
		return bench_usage("--core: threads x batch x block-size exceeds 64G");

	if (iterations != -1 &&
	    (iterations < 0 || iterations > BENCH_MAX_ITERATIONS || (iterations == 0 && !core)))
		return bench_usage("--iterations: %" G_GINT64_FORMAT " is not in [%d, 2^48]",
				   (gint64)iterations, core ? 0 : 1);
	o->iterations = iterations;
	if (warmup < 0 || warmup > BENCH_MAX_WARMUP)
		return bench_usage("--warmup: %" G_GINT64_FORMAT " is not in [0, %" G_GINT64_FORMAT
				   "]",
				   (gint64)warmup, (gint64)BENCH_MAX_WARMUP);
	o->warmup = (uint32_t)warmup;
	if (duration) {
		char *end = NULL;

		o->duration_s = g_ascii_strtod(duration, &end);
		if (end == duration || *end || !(o->duration_s > 0.0) ||
		    o->duration_s > BENCH_MAX_DURATION)
			return bench_usage("--duration: invalid value '%s' (expected seconds in "
					   "(0, %.0f], e.g. 0.5, 10)",
					   duration, BENCH_MAX_DURATION);
	} else if (iterations >= 0)
		o->duration_s = 0.0; /* --iterations alone: no time limit */
	else
		o->duration_s = core	   ? BENCH_CORE_DURATION
				: runs > 1 ? BENCH_DEF_SWEEP_DURATION
					   : BENCH_DEF_DURATION;
	if (!(timeout > 0.0 && timeout <= BENCH_MAX_DURATION))
		return bench_usage("--timeout: %g is not in (0, %.0f] seconds", timeout,
				   BENCH_MAX_DURATION);
	o->timeout_s = timeout;

	if (buffer) {
		if (!bench_parse_size(buffer, &o->buffer_size) ||
		    o->buffer_size < BENCH_MIN_BUFFER || o->buffer_size > BENCH_MAX_BUFFER)
			return bench_usage("--buffer-size: invalid size '%s' (expected 8K to 1T "
					   "bytes, e.g. 256M, 1G)",
					   buffer);
		if (core || initiator)
			return bench_usage("--buffer-size sizes the target (--target, --loopback)");
	}
	if ((target_file && (core || initiator)) || (location && initiator))
		return bench_usage("--target-file and --location set up the target (--target, "
				   "--loopback, --core)");
	if (local_location && target)
		return bench_usage(
			"--local-location sets up the initiator (--initiator, --loopback, "
			"--core)");
	if ((location && !*location) || (local_location && !*local_location))
		return bench_usage("--location, --local-location: empty");
	o->target_file = target_file;
	o->location = location;
	o->local_location = local_location;

	if (output) {
		if (target)
			return bench_usage("--output writes result rows (--initiator, --loopback, "
					   "--core)");
		o->output_path = output;
		o->output = fopen(output, "we");
		if (!o->output)
			return bench_usage("--output: cannot write '%s': %s", output,
					   g_strerror(errno));
	}
	return BENCH_EXIT_OK;
}

/* Each --op of --core in turn, as its own run; the first failure ends the series. */
static int bench_core_ops(const struct bench_opts *o)
{
	int rc = BENCH_EXIT_OK;

	for (uint32_t i = 0; i < o->n_ops && rc == BENCH_EXIT_OK && !bench_signalled; i++) {
		struct bench_opts one = *o;

		one.op = o->ops[i];
		rc = bench_core_run(&one);
	}
	return rc;
}

int main(int argc, char **argv)
{
	struct bench_opts o;
	char *strs[12] = { NULL };
	int rc;

	memset(&o, 0, sizeof(o));
	rc = bench_parse_args(argc, argv, &o, strs);
	if (rc == BENCH_EXIT_VERSION) {
		rc = bench_version();
	} else if (rc == BENCH_EXIT_OK) {
		bench_signals_install();
		switch (o.mode) {
		case BENCH_MODE_TARGET:
			rc = bench_target(&o);
			break;
		case BENCH_MODE_INITIATOR:
			rc = bench_initiator(&o, "initiator", o.segment, NULL, 0);
			break;
		case BENCH_MODE_LOOPBACK:
			rc = bench_loopback(&o);
			break;
		case BENCH_MODE_CORE:
			rc = bench_core_ops(&o);
			break;
		}
	}
	if (o.output && fclose(o.output) != 0) {
		bench_err("--output %s: %s", o.output_path, g_strerror(errno));
		if (rc == BENCH_EXIT_OK)
			rc = BENCH_EXIT_FAIL;
	}
	for (size_t i = 0; i < G_N_ELEMENTS(strs); i++)
		g_free(strs[i]);
	return rc;
}
