/* SPDX-License-Identifier: Apache-2.0 */
/* fakedev.c: the vendor-neutral core of the fake GPU runtimes: memfd memory, IPC, streams, faults. */

/* fakedev.h says what it models; fakecuda.c and fakehip.c are the API shims over it. */

#include "fakedev.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FDEV_DEF_MEM (16ull << 30)
#define FDEV_STREAM_MAGIC 0x5354524du

struct fdev_op {
	uint8_t *dst;
	const uint8_t *src;
	size_t n;
	uint64_t seq;
	bool sticky;
};

struct fdev_stream {
	uint32_t magic; /* FDEV_STREAM_MAGIC while the stream may be used */
	struct fdev_ctx *ctx;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t work;
	pthread_cond_t done;
	struct fdev_op *ring;
	size_t cap, head, count;
	_Atomic uint64_t enqueued;  /* written under lock */
	_Atomic uint64_t completed; /* written under lock */
	bool stop;
	atomic_int refs; /* the creator and events recorded on it */
};

struct fdev_event {
	struct fdev_ctx *ctx;
	pthread_mutex_t lock;
	struct fdev_stream *stream; /* of the last record (a reference), NULL: none */
	uint64_t seq;
	unsigned flags;
};

struct fdev_state fdev = { .lock = PTHREAD_MUTEX_INITIALIZER };

FDEV_TLS struct fdev_ctx *fdev_current;

/* --- setup, helpers ------------------------------------------------------------------------ */

long long fdev_env_ll(const char *name, long long def)
{
	char var[96];
	const char *s;
	char *end = NULL;
	long long v;

	snprintf(var, sizeof(var), "%s_%s", fdev.cfg.prefix, name);
	s = getenv(var);
	if (!s || !*s)
		return def;
	errno = 0;
	v = strtoll(s, &end, 0);
	if (errno || !end || *end) {
		fprintf(stderr, "fakedev: %s='%s' is not a number; ignored\n", var, s);
		return def;
	}
	return v;
}

void fdev_configure(const struct fdev_config *cfg)
{
	long long n;

	fdev.cfg = *cfg;
	n = fdev_env_ll("DEVICES", 2);
	fdev.n_dev = n < 0 ? 0 : n > FDEV_MAX_DEV ? FDEV_MAX_DEV : (int)n;
	fdev.mem_bytes = (uint64_t)fdev_env_ll("MEM_BYTES", (long long)FDEV_DEF_MEM);
	fdev.oom_bytes = (uint64_t)fdev_env_ll("OOM_BYTES", (long long)fdev.mem_bytes);
	fdev.no_peer = fdev_env_ll("NO_PEER", 0) != 0;
	fdev.fabric = fdev_env_ll("FABRIC", 0) != 0;
	fdev.ipc_open_fail = fdev_env_ll("IPC_OPEN_FAIL", 0) != 0;
	fdev.inline_copies = fdev_env_ll("INLINE_COPIES", 0) != 0;
	fdev.fail_after = fdev_env_ll("FAIL_COPY_AFTER", -1);
	fdev.fail_count = fdev_env_ll("FAIL_COPY_COUNT", 1);
	fdev.sticky_after = fdev_env_ll("STICKY_AFTER", -1);
	fdev.delay_us = (unsigned)fdev_env_ll("COPY_DELAY_US", 0);
	fdev.sync_faults = fdev_env_ll("SYNC_FAULTS", 0) != 0;
	for (int i = 0; i < FDEV_MAX_DEV; i++)
		fdev.ctx[i].dev = i;
}

void fdev_set_inited(void)
{
	pthread_mutex_lock(&fdev.lock);
	fdev.inited = true;
	pthread_mutex_unlock(&fdev.lock);
}

enum fdev_err fdev_ready(void)
{
	return fdev.inited ? FDEV_OK : FDEV_E_NOT_INITIALIZED;
}

enum fdev_err fdev_check_dev(int dev)
{
	enum fdev_err r = fdev_ready();

	if (r)
		return r;
	return dev >= 0 && dev < fdev.n_dev ? FDEV_OK : FDEV_E_INVALID_DEVICE;
}

enum fdev_err fdev_cur(struct fdev_ctx **out)
{
	struct fdev_ctx *c = fdev_current;
	int sticky;

	if (!fdev.inited)
		return FDEV_E_NOT_INITIALIZED;
	if (!c && fdev.cfg.default_dev0)
		c = &fdev.ctx[0];
	if (!c)
		return FDEV_E_INVALID_CONTEXT;
	sticky = atomic_load(&c->sticky);
	if (sticky)
		return (enum fdev_err)sticky;
	*out = c;
	return FDEV_OK;
}

bool fdev_ctx_valid(const struct fdev_ctx *c)
{
	return c >= fdev.ctx && c < fdev.ctx + FDEV_MAX_DEV && c->dev < fdev.n_dev;
}

size_t fdev_round(size_t n, size_t to)
{
	return (n + to - 1) / to * to;
}

void fdev_pci_bus_id(int dev, char *buf, size_t len)
{
	snprintf(buf, len, "0000:%02X:00.0", 16 + 16 * dev);
}

bool fdev_can_access_peer(int dev, int peer)
{
	return dev != peer && !fdev.no_peer;
}

enum fdev_err fdev_enable_peer(struct fdev_ctx *c, int peer)
{
	enum fdev_err r = fdev_check_dev(peer);

	if (r)
		return r;
	if (!fdev_can_access_peer(c->dev, peer))
		return FDEV_E_PEER_UNSUPPORTED;
	pthread_mutex_lock(&fdev.lock);
	if (c->peers & (1u << peer)) {
		pthread_mutex_unlock(&fdev.lock);
		return FDEV_E_PEER_ALREADY_ENABLED;
	}
	c->peers |= 1u << peer;
	pthread_mutex_unlock(&fdev.lock);
	return FDEV_OK;
}

static void fdev_nonce(char *buf, size_t len)
{
	uint64_t r[2] = { 0, 0 };

	if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r))
		r[0] = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)time(NULL);
	snprintf(buf, len, "%016" PRIx64 "%04" PRIx64, r[0], r[1] & 0xffff);
}

/* --- physical allocations and maps ---------------------------------------------------------- */

enum fdev_err fdev_phys_new(int dev, size_t size, struct fdev_phys **out)
{
	struct fdev_phys *p = calloc(1, sizeof(*p));
	char name[64];

	if (!p)
		return FDEV_E_OUT_OF_MEMORY;
	fdev_nonce(p->nonce, sizeof(p->nonce));
	snprintf(name, sizeof(name), "fakedev-%d-%s", dev, p->nonce);
	p->fd = memfd_create(name, MFD_CLOEXEC);
	if (p->fd < 0 || ftruncate(p->fd, (off_t)size) != 0) {
		if (p->fd >= 0)
			close(p->fd);
		free(p);
		return FDEV_E_OUT_OF_MEMORY;
	}
	p->shadow = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, 0);
	if (p->shadow == MAP_FAILED) {
		close(p->fd);
		free(p);
		return FDEV_E_OUT_OF_MEMORY;
	}
	p->size = size;
	p->dev = dev;
	p->refs = 1;
	p->charged = true;
	p->next = fdev.phys;
	fdev.phys = p;
	*out = p;
	return FDEV_OK;
}

enum fdev_err fdev_phys_adopt(int fd, struct fdev_phys **out)
{
	struct fdev_phys *p;
	struct stat st;
	char link[64], target[256], nonce[24];
	const char *tag;
	ssize_t n;
	int dev = 0;

	if (fstat(fd, &st) != 0 || st.st_size <= 0)
		return FDEV_E_INVALID_HANDLE;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	if (n <= 0)
		return FDEV_E_INVALID_HANDLE;
	target[n] = '\0';
	tag = strstr(target, "fakedev-");
	if (!tag || sscanf(tag, "fakedev-%d-%23[0-9a-f]", &dev, nonce) != 2 || dev < 0 ||
	    dev >= FDEV_MAX_DEV)
		return FDEV_E_INVALID_HANDLE;
	p = calloc(1, sizeof(*p));
	if (!p)
		return FDEV_E_OUT_OF_MEMORY;
	p->shadow = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p->shadow == MAP_FAILED) {
		free(p);
		return FDEV_E_MAP_FAILED;
	}
	memcpy(p->nonce, nonce, sizeof(p->nonce));
	p->fd = fd;
	p->size = (size_t)st.st_size;
	p->dev = dev;
	p->refs = 1;
	p->next = fdev.phys;
	fdev.phys = p;
	*out = p;
	return FDEV_OK;
}

bool fdev_phys_live(const struct fdev_phys *p)
{
	for (const struct fdev_phys *q = fdev.phys; q; q = q->next)
		if (q == p)
			return true;
	return false;
}

void fdev_phys_unref(struct fdev_phys *p)
{
	if (--p->refs > 0)
		return;
	for (struct fdev_phys **pp = &fdev.phys; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	if (p->charged)
		fdev.allocated[p->dev] -= p->size;
	munmap(p->shadow, p->size);
	close(p->fd);
	free(p);
}

enum fdev_err fdev_charge(int dev, size_t size)
{
	if (fdev.allocated[dev] + size > fdev.oom_bytes || size > fdev.mem_bytes)
		return FDEV_E_OUT_OF_MEMORY;
	fdev.allocated[dev] += size;
	return FDEV_OK;
}

/* Index of the first map with va > @va. */
static size_t fdev_map_upper(uintptr_t va)
{
	size_t lo = 0, hi = fdev.n_maps;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (fdev.maps[mid].va <= va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

struct fdev_map *fdev_map_find(uintptr_t va)
{
	size_t i = fdev_map_upper(va);

	if (i == 0)
		return NULL;
	if (va - fdev.maps[i - 1].va < fdev.maps[i - 1].vsize)
		return &fdev.maps[i - 1];
	return NULL;
}

enum fdev_err fdev_map_insert(const struct fdev_map *m)
{
	size_t i;

	if (fdev.n_maps == fdev.cap_maps) {
		size_t cap = fdev.cap_maps ? 2 * fdev.cap_maps : 16;
		struct fdev_map *n = realloc(fdev.maps, cap * sizeof(*n));

		if (!n)
			return FDEV_E_OUT_OF_MEMORY;
		fdev.maps = n;
		fdev.cap_maps = cap;
	}
	i = fdev_map_upper(m->va);
	memmove(&fdev.maps[i + 1], &fdev.maps[i], (fdev.n_maps - i) * sizeof(*m));
	fdev.maps[i] = *m;
	fdev.n_maps++;
	atomic_fetch_add_explicit(&fdev.map_gen, 1, memory_order_release);
	return FDEV_OK;
}

void fdev_map_remove(struct fdev_map *m)
{
	size_t i = (size_t)(m - fdev.maps);

	memmove(&fdev.maps[i], &fdev.maps[i + 1], (fdev.n_maps - i - 1) * sizeof(*m));
	fdev.n_maps--;
	atomic_fetch_add_explicit(&fdev.map_gen, 1, memory_order_release);
}

struct fdev_resv *fdev_resv_find(uintptr_t va, size_t len)
{
	for (size_t i = 0; i < fdev.n_resv; i++)
		if (va >= fdev.resv[i].va && va - fdev.resv[i].va < fdev.resv[i].size &&
		    len <= fdev.resv[i].size - (va - fdev.resv[i].va))
			return &fdev.resv[i];
	return NULL;
}

void *fdev_reserve(size_t size)
{
	void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

/*
 * Host address of the bytes [@p, +@n) that a copy on device @dev reads (@write false) or writes:
 * device memory through its shadow, anything else is host memory as is. Under fdev.lock.
 */
static enum fdev_err fdev_translate(uintptr_t p, size_t n, int dev, bool write, uint8_t **out)
{
	struct fdev_map *m = fdev_map_find(p);

	if (!m) {
		if (fdev_resv_find(p, 1))
			return FDEV_E_INVALID_VALUE; /* reserved, nothing mapped there */
		*out = (uint8_t *)p;
		return FDEV_OK;
	}
	if (p - m->va > m->size || n > m->size - (p - m->va))
		return FDEV_E_INVALID_VALUE;
	if (m->kind == FDEV_MAP_VMM && dev >= 0) {
		unsigned bit = 1u << dev;

		if (!(m->access_rw & bit) && (write || !(m->access_ro & bit)))
			return FDEV_E_INVALID_VALUE;
	}
	*out = m->phys->shadow + (p - m->va);
	return FDEV_OK;
}

int fdev_open_remote(int32_t pid, int32_t fd, const char *nonce, enum fdev_err *why)
{
	char path[64], target[256];
	ssize_t n;
	int nfd;

	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, (int)fd);
	n = readlink(path, target, sizeof(target) - 1);
	if (n <= 0) {
		*why = FDEV_E_INVALID_HANDLE; /* the process or its allocation is gone */
		return -1;
	}
	target[n] = '\0';
	if (!strstr(target, "fakedev-") || !strstr(target, nonce)) {
		*why = FDEV_E_INVALID_HANDLE;
		return -1;
	}
	nfd = open(path, O_RDWR | O_CLOEXEC);
	if (nfd < 0)
		*why = errno == EACCES || errno == EPERM ? FDEV_E_NOT_PERMITTED
							 : FDEV_E_INVALID_HANDLE;
	return nfd;
}

/* --- device allocations, host registrations, dmabufs ------------------------------------- */

enum fdev_err fdev_alloc(size_t size, uintptr_t *out)
{
	struct fdev_ctx *c;
	struct fdev_phys *p = NULL;
	struct fdev_map m;
	size_t vsize;
	void *va;
	enum fdev_err r = fdev_cur(&c);

	if (r)
		return r;
	if (!out || !size)
		return FDEV_E_INVALID_VALUE;
	vsize = fdev_round(size, FDEV_PAGE);
	pthread_mutex_lock(&fdev.lock);
	r = fdev_charge(c->dev, vsize);
	if (r)
		goto out;
	r = fdev_phys_new(c->dev, vsize, &p);
	if (r) {
		fdev.allocated[c->dev] -= vsize;
		goto out;
	}
	va = fdev_reserve(vsize);
	if (!va) {
		fdev_phys_unref(p);
		r = FDEV_E_OUT_OF_MEMORY;
		goto out;
	}
	m = (struct fdev_map){ .va = (uintptr_t)va,
			       .size = size,
			       .vsize = vsize,
			       .phys = p,
			       .kind = FDEV_MAP_ALLOC,
			       .dev = c->dev };
	r = fdev_map_insert(&m);
	if (r) {
		munmap(va, vsize);
		fdev_phys_unref(p);
		goto out;
	}
	*out = (uintptr_t)va;
out:
	pthread_mutex_unlock(&fdev.lock);
	return r;
}

enum fdev_err fdev_free(uintptr_t p)
{
	struct fdev_map *m;
	enum fdev_err r = fdev_ready();

	if (r)
		return r;
	if (!p)
		return FDEV_OK;
	pthread_mutex_lock(&fdev.lock);
	m = fdev_map_find(p);
	if (!m || m->va != p || m->kind != FDEV_MAP_ALLOC) {
		pthread_mutex_unlock(&fdev.lock);
		return FDEV_E_INVALID_VALUE;
	}
	munmap((void *)m->va, m->vsize);
	fdev_phys_unref(m->phys);
	fdev_map_remove(m);
	pthread_mutex_unlock(&fdev.lock);
	return FDEV_OK;
}

enum fdev_err fdev_address_range(uintptr_t p, uintptr_t *base, size_t *size)
{
	struct fdev_map *m;
	enum fdev_err r = fdev_ready();

	if (r)
		return r;
	pthread_mutex_lock(&fdev.lock);
	m = fdev_map_find(p);
	if (!m || p - m->va >= m->size) {
		pthread_mutex_unlock(&fdev.lock);
		return FDEV_E_NOT_FOUND;
	}
	if (base)
		*base = m->va;
	if (size)
		*size = m->size;
	pthread_mutex_unlock(&fdev.lock);
	return FDEV_OK;
}

bool fdev_is_device(uintptr_t p, int *dev)
{
	struct fdev_map *m;
	bool yes;

	pthread_mutex_lock(&fdev.lock);
	m = fdev_map_find(p);
	yes = m && p - m->va < m->size;
	if (yes && dev)
		*dev = m->dev;
	pthread_mutex_unlock(&fdev.lock);
	return yes;
}

struct fdev_hostreg *fdev_hostreg_find(uintptr_t p)
{
	for (size_t i = 0; i < fdev.n_hregs; i++)
		if (p >= fdev.hregs[i].p && p - fdev.hregs[i].p < fdev.hregs[i].size)
			return &fdev.hregs[i];
	return NULL;
}

enum fdev_err fdev_host_register(void *p, size_t size)
{
	struct fdev_ctx *c;
	enum fdev_err r = fdev_cur(&c);

	if (r)
		return r;
	if (!p || !size)
		return FDEV_E_INVALID_VALUE;
	pthread_mutex_lock(&fdev.lock);
	for (size_t i = 0; i < fdev.n_hregs; i++) {
		if ((uintptr_t)p < fdev.hregs[i].p + fdev.hregs[i].size &&
		    fdev.hregs[i].p < (uintptr_t)p + size) {
			pthread_mutex_unlock(&fdev.lock);
			return FDEV_E_HOST_ALREADY_REGISTERED;
		}
	}
	if (fdev_map_find((uintptr_t)p)) {
		pthread_mutex_unlock(&fdev.lock);
		return FDEV_E_INVALID_VALUE;
	}
	if (fdev.n_hregs == fdev.cap_hregs) {
		size_t cap = fdev.cap_hregs ? 2 * fdev.cap_hregs : 8;
		struct fdev_hostreg *n = realloc(fdev.hregs, cap * sizeof(*n));

		if (!n) {
			pthread_mutex_unlock(&fdev.lock);
			return FDEV_E_OUT_OF_MEMORY;
		}
		fdev.hregs = n;
		fdev.cap_hregs = cap;
	}
	fdev.hregs[fdev.n_hregs++] = (struct fdev_hostreg){ (uintptr_t)p, size };
	pthread_mutex_unlock(&fdev.lock);
	return FDEV_OK;
}

enum fdev_err fdev_host_unregister(void *p)
{
	enum fdev_err r = fdev_ready();

	if (r)
		return r;
	pthread_mutex_lock(&fdev.lock);
	for (size_t i = 0; i < fdev.n_hregs; i++) {
		if (fdev.hregs[i].p == (uintptr_t)p) {
			fdev.hregs[i] = fdev.hregs[--fdev.n_hregs];
			pthread_mutex_unlock(&fdev.lock);
			return FDEV_OK;
		}
	}
	pthread_mutex_unlock(&fdev.lock);
	return FDEV_E_HOST_NOT_REGISTERED;
}

enum fdev_err fdev_dmabuf(uintptr_t p, size_t size, int *fd_out)
{
	struct fdev_map *m;
	enum fdev_err r = fdev_ready();

	if (r)
		return r;
	if (!fd_out || !size || size % FDEV_PAGE || p % FDEV_PAGE)
		return FDEV_E_INVALID_VALUE;
	pthread_mutex_lock(&fdev.lock);
	m = fdev_map_find(p);
	/* The fake's dma-buf is the memfd itself: it starts at the allocation. */
	if (!m || m->va != p || size > fdev_round(m->size, FDEV_PAGE)) {
		r = FDEV_E_INVALID_VALUE;
	} else {
		int fd = fcntl(m->phys->fd, F_DUPFD_CLOEXEC, 0);

		if (fd < 0)
			r = FDEV_E_OUT_OF_MEMORY;
		else
			*fd_out = fd;
	}
	pthread_mutex_unlock(&fdev.lock);
	return r;
}

/* --- IPC handles ------------------------------------------------------------------------------- */

void fdev_handle_fill(struct fdev_handle *h, const char *magic, const struct fdev_phys *p,
		      uint64_t size, int dev)
{
	memset(h, 0, sizeof(*h));
	memcpy(h->magic, magic, sizeof(h->magic));
	h->pid = (int32_t)getpid();
	h->fd = p->fd;
	h->size = size;
	h->dev = dev;
	memcpy(h->nonce, p->nonce, sizeof(h->nonce));
}

enum fdev_err fdev_ipc_get(uintptr_t p, const char *magic, void *out, size_t len)
{
	struct fdev_map *m;
	struct fdev_handle h;
	enum fdev_err r = fdev_ready();

	if (r)
		return r;
	if (!out || len < sizeof(h))
		return FDEV_E_INVALID_VALUE;
	pthread_mutex_lock(&fdev.lock);
	m = fdev_map_find(p);
	if (!m || m->kind != FDEV_MAP_ALLOC) {
		pthread_mutex_unlock(&fdev.lock);
		return FDEV_E_INVALID_VALUE;
	}
	fdev_handle_fill(&h, magic, m->phys, m->size, m->dev);
	pthread_mutex_unlock(&fdev.lock);
	memset(out, 0, len);
	memcpy(out, &h, sizeof(h));
	return FDEV_OK;
}

/* Map @p (taken over) at a fresh device address. */
static enum fdev_err fdev_map_imported(struct fdev_phys *p, size_t size, int dev, uintptr_t *va_out)
{
	struct fdev_map m;
	size_t vsize = fdev_round(p->size, FDEV_PAGE);
	void *va = fdev_reserve(vsize);
	enum fdev_err r;

	if (!va)
		return FDEV_E_OUT_OF_MEMORY;
	m = (struct fdev_map){ .va = (uintptr_t)va,
			       .size = size,
			       .vsize = vsize,
			       .phys = p,
			       .kind = FDEV_MAP_IPC,
			       .dev = dev,
			       .ipc_refs = 1 };
	r = fdev_map_insert(&m);
	if (r) {
		munmap(va, vsize);
		return r;
	}
	*va_out = (uintptr_t)va;
	return FDEV_OK;
}

enum fdev_err fdev_ipc_open(const void *handle, const char *magic, uintptr_t *out)
{
	struct fdev_ctx *c;
	struct fdev_phys *p;
	struct fdev_handle h;
	uintptr_t va = 0;
	int fd;
	enum fdev_err r = fdev_cur(&c);

	if (r)
		return r;
	memcpy(&h, handle, sizeof(h));
	if (!out || memcmp(h.magic, magic, sizeof(h.magic)) != 0 || h.size == 0)
		return FDEV_E_INVALID_VALUE;
	h.nonce[sizeof(h.nonce) - 1] = '\0';
	if (fdev.ipc_open_fail)
		return FDEV_E_MAP_FAILED;
	if (h.pid == (int32_t)getpid())
		return FDEV_E_INVALID_CONTEXT; /* handles are for other processes */
	pthread_mutex_lock(&fdev.lock);
	/* The same handle opened again in this process: the same mapping, counted. */
	for (size_t i = 0; i < fdev.n_maps; i++) {
		struct fdev_map *m = &fdev.maps[i];

		if (m->kind == FDEV_MAP_IPC && strcmp(m->phys->nonce, h.nonce) == 0) {
			m->ipc_refs++;
			*out = m->va;
			pthread_mutex_unlock(&fdev.lock);
			return FDEV_OK;
		}
	}
	fd = fdev_open_remote(h.pid, h.fd, h.nonce, &r);
	if (fd < 0)
		goto out;
	r = fdev_phys_adopt(fd, &p);
	if (r) {
		close(fd);
		goto out;
	}
	if (h.size > p->size) {
		fdev_phys_unref(p);
		r = FDEV_E_INVALID_HANDLE;
		goto out;
	}
	r = fdev_map_imported(p, (size_t)h.size, h.dev, &va);
	if (r) {
		fdev_phys_unref(p);
		goto out;
	}
	*out = va;
out:
	pthread_mutex_unlock(&fdev.lock);
	return r;
}

enum fdev_err fdev_ipc_close(uintptr_t p)
{
	struct fdev_map *m;
	enum fdev_err r = fdev_ready();

	if (r)
		return r;
	pthread_mutex_lock(&fdev.lock);
	m = fdev_map_find(p);
	if (!m || m->va != p || m->kind != FDEV_MAP_IPC) {
		pthread_mutex_unlock(&fdev.lock);
		return FDEV_E_INVALID_VALUE;
	}
	if (--m->ipc_refs == 0) {
		munmap((void *)m->va, m->vsize);
		fdev_phys_unref(m->phys);
		fdev_map_remove(m);
	}
	pthread_mutex_unlock(&fdev.lock);
	return FDEV_OK;
}

/* --- streams ------------------------------------------------------------------------------- */

static void *fdev_stream_main(void *arg)
{
	struct fdev_stream *s = arg;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		struct fdev_op op;

		while (!s->count && !s->stop)
			pthread_cond_wait(&s->work, &s->lock);
		if (!s->count)
			break;
		op = s->ring[s->head];
		pthread_mutex_unlock(&s->lock);
		if (fdev.delay_us)
			usleep(fdev.delay_us);
		if (op.sticky)
			atomic_store(&s->ctx->sticky, FDEV_E_ILLEGAL_ADDRESS);
		else if (!atomic_load(&s->ctx->sticky))
			memcpy(op.dst, op.src, op.n);
		pthread_mutex_lock(&s->lock);
		s->head = (s->head + 1) % s->cap;
		s->count--;
		atomic_store_explicit(&s->completed, op.seq, memory_order_release);
		pthread_cond_broadcast(&s->done);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

static bool fdev_stream_live(const struct fdev_stream *s)
{
	for (size_t i = 0; i < fdev.n_streams; i++)
		if (fdev.streams[i] == s)
			return true;
	return false;
}

enum fdev_err fdev_stream_create(struct fdev_stream **out)
{
	struct fdev_ctx *c;
	struct fdev_stream *s;
	enum fdev_err r = fdev_cur(&c);

	if (r)
		return r;
	if (!out)
		return FDEV_E_INVALID_VALUE;
	s = calloc(1, sizeof(*s));
	if (!s)
		return FDEV_E_OUT_OF_MEMORY;
	s->magic = FDEV_STREAM_MAGIC;
	s->ctx = c;
	s->cap = 64;
	s->ring = calloc(s->cap, sizeof(*s->ring));
	s->refs = 1;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->work, NULL);
	pthread_cond_init(&s->done, NULL);
	pthread_mutex_lock(&fdev.lock);
	if (fdev.n_streams == fdev.cap_streams) {
		size_t cap = fdev.cap_streams ? 2 * fdev.cap_streams : 16;
		struct fdev_stream **n = realloc(fdev.streams, cap * sizeof(*n));

		if (n) {
			fdev.streams = n;
			fdev.cap_streams = cap;
		}
	}
	if (!s->ring || fdev.n_streams == fdev.cap_streams ||
	    pthread_create(&s->thread, NULL, fdev_stream_main, s) != 0) {
		pthread_mutex_unlock(&fdev.lock);
		free(s->ring);
		free(s);
		return FDEV_E_OUT_OF_MEMORY;
	}
	fdev.streams[fdev.n_streams++] = s;
	pthread_mutex_unlock(&fdev.lock);
	*out = s;
	return FDEV_OK;
}

/* Drop a reference; the last frees the stream (its thread was joined at destroy). */
static void fdev_stream_unref(struct fdev_stream *s)
{
	if (atomic_fetch_sub(&s->refs, 1) > 1)
		return;
	s->magic = 0;
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->work);
	pthread_cond_destroy(&s->done);
	free(s->ring);
	free(s);
}

enum fdev_err fdev_stream_destroy(struct fdev_stream *s)
{
	enum fdev_err r = fdev_ready();

	if (r)
		return r;
	pthread_mutex_lock(&fdev.lock);
	if (!s || !fdev_stream_live(s)) {
		pthread_mutex_unlock(&fdev.lock);
		return FDEV_E_INVALID_HANDLE;
	}
	for (size_t i = 0; i < fdev.n_streams; i++) {
		if (fdev.streams[i] == s) {
			fdev.streams[i] = fdev.streams[--fdev.n_streams];
			break;
		}
	}
	pthread_mutex_unlock(&fdev.lock);
	/* Work already enqueued still runs, as on a GPU. */
	pthread_mutex_lock(&s->lock);
	s->stop = true;
	pthread_cond_signal(&s->work);
	pthread_mutex_unlock(&s->lock);
	pthread_join(s->thread, NULL);
	fdev_stream_unref(s);
	return FDEV_OK;
}

/* A stream handle of this runtime; its context's sticky error if it has one. */
static enum fdev_err fdev_stream_check(struct fdev_stream *s)
{
	enum fdev_err r = fdev_ready();

	if (r)
		return r;
	if (s) {
		if (s->magic != FDEV_STREAM_MAGIC)
			return FDEV_E_INVALID_HANDLE;
		r = (enum fdev_err)atomic_load(&s->ctx->sticky);
	}
	return r;
}

struct fdev_ctx *fdev_stream_ctx(struct fdev_stream *s)
{
	return s->ctx;
}

/* Wait until @s ran what was enqueued up to @seq. */
static void fdev_stream_wait(struct fdev_stream *s, uint64_t seq)
{
	pthread_mutex_lock(&s->lock);
	while (atomic_load(&s->completed) < seq)
		pthread_cond_wait(&s->done, &s->lock);
	pthread_mutex_unlock(&s->lock);
}

enum fdev_err fdev_stream_sync(struct fdev_stream *s)
{
	enum fdev_err r = fdev_stream_check(s);

	if (r || !s)
		return r;
	fdev_stream_wait(s, atomic_load(&s->enqueued));
	return (enum fdev_err)atomic_load(&s->ctx->sticky);
}

enum fdev_err fdev_stream_query(struct fdev_stream *s)
{
	enum fdev_err r = fdev_stream_check(s);
	bool idle;

	if (r || !s)
		return r;
	pthread_mutex_lock(&s->lock);
	idle = atomic_load(&s->completed) >= atomic_load(&s->enqueued);
	pthread_mutex_unlock(&s->lock);
	return idle ? FDEV_OK : FDEV_E_NOT_READY;
}

enum fdev_err fdev_ctx_sync(struct fdev_ctx *c)
{
	struct fdev_stream *mine[256];
	size_t n = 0;

	pthread_mutex_lock(&fdev.lock);
	for (size_t i = 0; i < fdev.n_streams && n < 256; i++) {
		if (fdev.streams[i]->ctx == c) {
			atomic_fetch_add(&fdev.streams[i]->refs, 1);
			mine[n++] = fdev.streams[i];
		}
	}
	pthread_mutex_unlock(&fdev.lock);
	for (size_t i = 0; i < n; i++)
		fdev_stream_wait(mine[i], atomic_load(&mine[i]->enqueued));
	for (size_t i = 0; i < n; i++)
		fdev_stream_unref(mine[i]);
	return (enum fdev_err)atomic_load(&c->sticky);
}

/* --- copies -------------------------------------------------------------------------------- */

/*
 * The device map each end of this thread's last copy fell in, valid while fdev.map_gen stays:
 * a copy between the same allocations as the last one needs no lock (what the runtime costs
 * should not hide what te costs in te-bench's per-slice figures).
 */
struct fdev_tcache {
	uint64_t gen;
	uintptr_t va;
	size_t size;
	uint8_t *base;
	int dev;
	bool ok; /* @dev may access it (read-write for the destination) */
};

static FDEV_TLS struct fdev_tcache fdev_tc[2];

static bool fdev_tc_hit(const struct fdev_tcache *c, uint64_t gen, uintptr_t p, size_t n, int dev,
			uint8_t **out)
{
	if (c->gen != gen || !c->base || c->dev != dev || !c->ok || p < c->va ||
	    p - c->va > c->size || n > c->size - (p - c->va))
		return false;
	*out = c->base + (p - c->va);
	return true;
}

static void fdev_tc_fill(struct fdev_tcache *c, uint64_t gen, uintptr_t p, int dev)
{
	struct fdev_map *m = fdev_map_find(p);
	uint8_t *base;

	c->base = NULL;
	if (!m || fdev_translate(m->va, 0, dev, c == &fdev_tc[0], &base) != FDEV_OK)
		return;
	c->gen = gen;
	c->va = m->va;
	c->size = m->size;
	c->base = base;
	c->dev = dev;
	c->ok = true;
}

/* Resolve both ends of a copy run by device @dev (-1: no device restriction). */
static enum fdev_err fdev_copy_ends(uintptr_t dst, uintptr_t src, size_t n, int dev, uint8_t **d,
				    uint8_t **s)
{
	uint64_t gen = atomic_load_explicit(&fdev.map_gen, memory_order_acquire);
	enum fdev_err r;

	if (fdev_tc_hit(&fdev_tc[0], gen, dst, n, dev, d) &&
	    fdev_tc_hit(&fdev_tc[1], gen, src, n, dev, s))
		return FDEV_OK;
	pthread_mutex_lock(&fdev.lock);
	gen = atomic_load_explicit(&fdev.map_gen, memory_order_acquire);
	r = fdev_translate(dst, n, dev, true, d);
	if (!r)
		r = fdev_translate(src, n, dev, false, s);
	if (!r) {
		fdev_tc_fill(&fdev_tc[0], gen, dst, dev);
		fdev_tc_fill(&fdev_tc[1], gen, src, dev);
	}
	pthread_mutex_unlock(&fdev.lock);
	return r;
}

/* Copy number k + 1 of this process: whether it fails at launch. */
static bool fdev_copy_fails(long long k)
{
	return fdev.fail_after >= 0 && k >= fdev.fail_after &&
	       (fdev.fail_count <= 0 || k < fdev.fail_after + fdev.fail_count);
}

enum fdev_err fdev_copy(uintptr_t dst, uintptr_t src, size_t n)
{
	struct fdev_ctx *c;
	uint8_t *d, *s;
	enum fdev_err r = fdev_cur(&c);

	if (r)
		return r;
	if (!n)
		return FDEV_OK;
	r = fdev_copy_ends(dst, src, n, c->dev, &d, &s);
	if (r)
		return r;
	if (fdev.sync_faults) {
		if (fdev_copy_fails(atomic_fetch_add(&fdev.copies, 1)))
			return FDEV_E_UNKNOWN;
		if (fdev.delay_us)
			usleep(fdev.delay_us);
	}
	memmove(d, s, n);
	return FDEV_OK;
}

enum fdev_err fdev_copy_async(uintptr_t dst, uintptr_t src, size_t n, struct fdev_stream *st)
{
	struct fdev_ctx *c;
	struct fdev_op op = { 0 };
	long long k;
	enum fdev_err r = fdev_cur(&c);

	if (r)
		return r;
	if (!st)
		return fdev_copy(dst, src, n);
	r = fdev_stream_check(st);
	if (r)
		return r;
	if (st->ctx != c)
		return FDEV_E_INVALID_CONTEXT;
	if (!n)
		return FDEV_OK;
	r = fdev_copy_ends(dst, src, n, c->dev, &op.dst, (uint8_t **)&op.src);
	if (r)
		return r;
	if (fdev.fail_after >= 0 || fdev.sticky_after >= 0) {
		k = atomic_fetch_add(&fdev.copies, 1); /* this is copy number k + 1 */
		if (fdev_copy_fails(k))
			return FDEV_E_UNKNOWN;
		op.sticky = fdev.sticky_after >= 0 && k >= fdev.sticky_after;
	}
	op.n = n;
	pthread_mutex_lock(&st->lock);
	if (fdev.inline_copies && !st->count && !op.sticky && !fdev.delay_us) {
		/* In order: nothing is queued before it. */
		memcpy(op.dst, op.src, op.n);
		op.seq = atomic_load_explicit(&st->enqueued, memory_order_relaxed) + 1;
		atomic_store_explicit(&st->enqueued, op.seq, memory_order_release);
		atomic_store_explicit(&st->completed, op.seq, memory_order_release);
		pthread_mutex_unlock(&st->lock);
		return FDEV_OK;
	}
	if (st->count == st->cap) {
		size_t cap = 2 * st->cap;
		struct fdev_op *ring = malloc(cap * sizeof(*ring));

		if (!ring) {
			pthread_mutex_unlock(&st->lock);
			return FDEV_E_OUT_OF_MEMORY;
		}
		for (size_t i = 0; i < st->count; i++)
			ring[i] = st->ring[(st->head + i) % st->cap];
		free(st->ring);
		st->ring = ring;
		st->head = 0;
		st->cap = cap;
	}
	op.seq = atomic_load_explicit(&st->enqueued, memory_order_relaxed) + 1;
	atomic_store_explicit(&st->enqueued, op.seq, memory_order_release);
	st->ring[(st->head + st->count) % st->cap] = op;
	st->count++;
	pthread_cond_signal(&st->work);
	pthread_mutex_unlock(&st->lock);
	return FDEV_OK;
}

/* --- events -------------------------------------------------------------------------------- */

enum fdev_err fdev_event_create(unsigned flags, struct fdev_event **out)
{
	struct fdev_ctx *c;
	struct fdev_event *e;
	enum fdev_err r = fdev_cur(&c);

	if (r)
		return r;
	if (!out)
		return FDEV_E_INVALID_VALUE;
	e = calloc(1, sizeof(*e));
	if (!e)
		return FDEV_E_OUT_OF_MEMORY;
	e->ctx = c;
	e->flags = flags;
	pthread_mutex_init(&e->lock, NULL);
	pthread_mutex_lock(&fdev.lock);
	fdev.n_events++;
	pthread_mutex_unlock(&fdev.lock);
	*out = e;
	return FDEV_OK;
}

enum fdev_err fdev_event_destroy(struct fdev_event *e)
{
	enum fdev_err r = fdev_ready();

	if (r)
		return r;
	if (!e)
		return FDEV_E_INVALID_HANDLE;
	if (e->stream)
		fdev_stream_unref(e->stream);
	pthread_mutex_lock(&fdev.lock);
	fdev.n_events--;
	pthread_mutex_unlock(&fdev.lock);
	pthread_mutex_destroy(&e->lock);
	free(e);
	return FDEV_OK;
}

enum fdev_err fdev_event_record(struct fdev_event *e, struct fdev_stream *s)
{
	struct fdev_stream *old;
	uint64_t seq = 0;
	enum fdev_err r = fdev_stream_check(s);

	if (r)
		return r;
	if (!e)
		return FDEV_E_INVALID_HANDLE;
	if (atomic_load(&e->ctx->sticky))
		return (enum fdev_err)atomic_load(&e->ctx->sticky);
	if (s) {
		/* What was enqueued before this call (the caller orders its own calls). */
		seq = atomic_load(&s->enqueued);
		atomic_fetch_add(&s->refs, 1);
	}
	pthread_mutex_lock(&e->lock);
	old = e->stream;
	e->stream = s;
	e->seq = seq;
	pthread_mutex_unlock(&e->lock);
	if (old)
		fdev_stream_unref(old);
	return FDEV_OK;
}

enum fdev_err fdev_event_query(struct fdev_event *e)
{
	struct fdev_stream *s;
	uint64_t seq;
	bool done;
	enum fdev_err r = fdev_ready();

	if (r)
		return r;
	if (!e)
		return FDEV_E_INVALID_HANDLE;
	if (atomic_load(&e->ctx->sticky))
		return (enum fdev_err)atomic_load(&e->ctx->sticky);
	/* The event's own reference keeps its stream while its lock is held. */
	pthread_mutex_lock(&e->lock);
	s = e->stream;
	seq = e->seq;
	done = !s || atomic_load_explicit(&s->completed, memory_order_acquire) >= seq;
	pthread_mutex_unlock(&e->lock);
	if (atomic_load(&e->ctx->sticky))
		return (enum fdev_err)atomic_load(&e->ctx->sticky);
	return done ? FDEV_OK : FDEV_E_NOT_READY;
}

enum fdev_err fdev_event_sync(struct fdev_event *e)
{
	struct fdev_stream *s;
	uint64_t seq;
	enum fdev_err r = fdev_ready();

	if (r)
		return r;
	if (!e)
		return FDEV_E_INVALID_HANDLE;
	/* The stream and sequence the event waits for, with a reference on the stream. */
	pthread_mutex_lock(&e->lock);
	s = e->stream;
	seq = e->seq;
	if (s)
		atomic_fetch_add(&s->refs, 1);
	pthread_mutex_unlock(&e->lock);
	if (s) {
		fdev_stream_wait(s, seq);
		fdev_stream_unref(s);
	}
	return (enum fdev_err)atomic_load(&e->ctx->sticky);
}

/* --- for tests ---------------------------------------------------------------------------- */

void fakedev_live(struct fakedev_live *out)
{
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&fdev.lock);
	for (size_t i = 0; i < fdev.n_maps; i++) {
		if (fdev.maps[i].kind == FDEV_MAP_ALLOC)
			out->allocs++;
		else if (fdev.maps[i].kind == FDEV_MAP_IPC)
			out->ipc_maps++;
		else
			out->vmm_maps++;
	}
	for (const struct fdev_phys *p = fdev.phys; p; p = p->next)
		out->vmm_handles += p->vmm;
	out->reservations = (int)fdev.n_resv;
	out->host_regs = (int)fdev.n_hregs;
	out->streams = (int)fdev.n_streams;
	out->events = fdev.n_events;
	for (int i = 0; i < FDEV_MAX_DEV; i++)
		out->ctx_refs += fdev.ctx[i].refs;
	pthread_mutex_unlock(&fdev.lock);
}
