/* SPDX-License-Identifier: Apache-2.0 */
/* efa_nic.c: the efa plugin's NICs (libfabric domains), address vectors and peers. */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/tcp.h>

#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <te/te_plugin_opts.h>

#include "efa.h"


/* --- NICs ------------------------------------------------------------------------------- */

/* Whether domain @name is selected by the 'devices' option ("rdmap16s27" names the RDM one). */
static bool efa_device_wanted(const struct efa_inst *ei, const char *name)
{
	const char *p = ei->devices;

	if (!p)
		return true;
	while (*p) {
		size_t len = strcspn(p, ",");
		size_t nlen = strlen(name);

		while (len && (*p == ' ')) {
			p++;
			len--;
		}
		if (len && ((nlen == len && strncmp(name, p, len) == 0) ||
			    (nlen == len + 4 && strncmp(name, p, len) == 0 &&
			     strcmp(name + len, "-rdm") == 0)))
			return true;
		p += len;
		if (*p == ',')
			p++;
	}
	return false;
}

static int32_t efa_pci_numa(const struct fi_info *info, char *pci, size_t cap)
{
	const struct fi_pci_attr *a;
	char path[128];
	FILE *f;
	int numa = -1;

	pci[0] = '\0';
	if (!info->nic || !info->nic->bus_attr || info->nic->bus_attr->bus_type != FI_BUS_PCI)
		return -1;
	a = &info->nic->bus_attr->attr.pci;
	snprintf(pci, cap, "%04x:%02x:%02x.%x", a->domain_id, a->bus_id, a->device_id,
		 a->function_id);
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", pci);
	f = fopen(path, "re");
	if (f) {
		if (fscanf(f, "%d", &numa) != 1)
			numa = -1;
		fclose(f);
	}
	return numa;
}

/* Open fabric, domain, CQ, AV and endpoint of @nic from its fi_info. */
static enum te_status efa_nic_open(struct efa_inst *ei, struct efa_nic *nic)
{
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_CONTEXT };
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	struct fi_info *info = nic->info;
	const char *step;
	uint32_t window;
	int ret;

	nic->wait_fd = -1;
	nic->mr_mode = (uint64_t)info->domain_attr->mr_mode;
	pthread_mutex_init(&nic->lock, NULL);
	atomic_init(&nic->next_key, 1);
	snprintf(nic->name, sizeof(nic->name), "%s", info->domain_attr->name);
	nic->numa = efa_pci_numa(info, nic->pci, sizeof(nic->pci));
	if (info->nic && info->nic->link_attr)
		nic->speed_mbps = (uint64_t)info->nic->link_attr->speed / 1000000u;

	window = ei->window_opt ? ei->window_opt : (uint32_t)EFA_MIN(info->tx_attr->size, 1024u);
	if (!window)
		window = 256;
	nic->window = window;
	nic->n_words = (window + 63) / 64;
	nic->bits = calloc(nic->n_words, sizeof(*nic->bits));
	nic->slots = calloc(window, sizeof(*nic->slots));
	if (!nic->bits || !nic->slots)
		return TE_ERR_NOMEM;
	/* Bits past the window stay set: never claimed. */
	if (window % 64)
		atomic_store(&nic->bits[nic->n_words - 1], ~0ull << (window % 64));

	step = "fi_fabric";
	ret = fi_fabric(info->fabric_attr, &nic->fabric, NULL);
	if (ret)
		goto err_fi;
	step = "fi_domain";
	ret = fi_domain(nic->fabric, info, &nic->domain, NULL);
	if (ret)
		goto err_fi;
	cq_attr.size = window + EFA_RX_BUFS + EFA_HELLO_PAIRS * 4u;
	ret = -FI_ENOSYS;
	if (ei->progress != EFA_PROGRESS_BUSY) {
		cq_attr.wait_obj = FI_WAIT_FD;
		ret = fi_cq_open(nic->domain, &cq_attr, &nic->cq, NULL);
		if (ret == 0 && fi_control(&nic->cq->fid, FI_GETWAIT, &nic->wait_fd) != 0) {
			fi_close(&nic->cq->fid);
			nic->cq = NULL;
			nic->wait_fd = -1;
			ret = -FI_ENOSYS;
		}
	}
	if (ret) {
		cq_attr.wait_obj = FI_WAIT_NONE;
		step = "fi_cq_open";
		ret = fi_cq_open(nic->domain, &cq_attr, &nic->cq, NULL);
		if (ret)
			goto err_fi;
	}
	nic->cq_fid = &nic->cq->fid;
	step = "fi_av_open";
	ret = fi_av_open(nic->domain, &av_attr, &nic->av, NULL);
	if (ret)
		goto err_fi;
	if (strcmp(ei->prov_name, "shm") == 0) {
		/*
		 * shm names its region after the pid unless told otherwise: a process killed
		 * without closing it leaves the name behind in /dev/shm, and a later process
		 * with the same pid fails fi_enable with EBUSY. A name of our own avoids that
		 * (and says whose region it is: te-efa-<pid>-...).
		 */
		char name[64];

		snprintf(name, sizeof(name), "te-efa-%d-%" PRIx64 "-%u", (int)getpid(),
			 efa_now_ns() ^ (uint64_t)(uintptr_t)nic, nic->index);
		free(info->src_addr);
		info->src_addr = strdup(name);
		if (!info->src_addr)
			return TE_ERR_NOMEM;
		info->src_addrlen = strlen(name) + 1;
	}
	step = "fi_endpoint";
	ret = fi_endpoint(nic->domain, info, &nic->ep, NULL);
	if (ret)
		goto err_fi;
	step = "fi_ep_bind(cq)";
	ret = fi_ep_bind(nic->ep, &nic->cq->fid, FI_TRANSMIT | FI_RECV);
	if (ret)
		goto err_fi;
	step = "fi_ep_bind(av)";
	ret = fi_ep_bind(nic->ep, &nic->av->fid, 0);
	if (ret)
		goto err_fi;
	step = "fi_enable";
	ret = fi_enable(nic->ep);
	if (ret)
		goto err_fi;
	nic->addrlen = sizeof(nic->addr);
	step = "fi_getname";
	ret = fi_getname(&nic->ep->fid, nic->addr, &nic->addrlen);
	if (ret)
		goto err_fi;
	if (nic->addrlen == 0 || nic->addrlen > EFA_MAX_ADDR) {
		efa_error(ei, EFA_NAME ": %s: endpoint address of %zu bytes (at most %u)",
			  nic->name, nic->addrlen, EFA_MAX_ADDR);
		return TE_ERR_NO_DEVICE;
	}
	return TE_OK;

err_fi:
	efa_error(ei, EFA_NAME ": %s (provider %s): %s: %s", nic->name, ei->prov_name, step,
		  fi_strerror(-ret));
	return TE_ERR_NO_DEVICE;
}

/* libfabric's interface for memory of kind @mem_type. */
static enum fi_hmem_iface efa_hmem_iface(uint32_t mem_type)
{
	switch (mem_type) {
	case TE_PLUGIN_MEM_CUDA:
		return FI_HMEM_CUDA;
	case TE_PLUGIN_MEM_HIP:
		return FI_HMEM_ROCR;
	default:
		return FI_HMEM_SYSTEM;
	}
}

/*
 * Register @len bytes at @addr on @nic with @access: host memory, or GPU memory of @mem_type
 * on device @dev through the provider's FI_HMEM interface; *mr_out, its descriptor and key.
 */
int efa_nic_reg(struct efa_nic *nic, void *addr, size_t len, uint64_t access, uint32_t mem_type,
		int32_t dev, struct fid_mr **mr_out, void **desc_out, uint64_t *key_out)
{
	struct iovec iov = { .iov_base = addr, .iov_len = len };
	struct fi_mr_attr attr = {
		.mr_iov = &iov,
		.iov_count = 1,
		.access = access,
		.iface = efa_hmem_iface(mem_type),
	};
	struct fid_mr *mr = NULL;
	int ret;

	if (mem_type == TE_PLUGIN_MEM_CUDA)
		attr.device.cuda = dev;
	/* Without FI_MR_PROV_KEY the requested key must be unique within the domain. */
	if (!(nic->mr_mode & FI_MR_PROV_KEY))
		attr.requested_key =
			atomic_fetch_add_explicit(&nic->next_key, 1, memory_order_relaxed);
	efa_nic_lock(nic);
	ret = fi_mr_regattr(nic->domain, &attr, 0, &mr);
	if (ret == 0 && (nic->mr_mode & FI_MR_ENDPOINT)) {
		ret = fi_mr_bind(mr, &nic->ep->fid, 0);
		if (ret == 0)
			ret = fi_mr_enable(mr);
		if (ret) {
			fi_close(&mr->fid);
			mr = NULL;
		}
	}
	efa_nic_unlock(nic);
	if (ret)
		return ret;
	*key_out = fi_mr_key(mr);
	if (*key_out == FI_KEY_NOTAVAIL) {
		efa_nic_lock(nic);
		fi_close(&mr->fid);
		efa_nic_unlock(nic);
		return -FI_EKEYREJECTED;
	}
	*desc_out = fi_mr_desc(mr);
	*mr_out = mr;
	return 0;
}

/* Register the warm-up message area of @nic and post its receives. */
static enum te_status efa_nic_msg_setup(struct efa_inst *ei, struct efa_nic *nic)
{
	uint64_t key;
	int ret;

	nic->msg = aligned_alloc(4096, 4096);
	if (!nic->msg)
		return TE_ERR_NOMEM;
	memset(nic->msg, 0, 4096);
	te_plugin_put_u64(nic->msg, EFA_HELLO_MAGIC);
	ret = efa_nic_reg(nic, nic->msg, 4096, FI_SEND | FI_RECV, TE_PLUGIN_MEM_CPU, -1,
			  &nic->msg_mr, &nic->msg_desc, &key);
	if (ret) {
		efa_error(ei, EFA_NAME ": %s: fi_mr_regattr of the message area: %s", nic->name,
			  fi_strerror(-ret));
		return TE_ERR_NO_DEVICE;
	}
	for (uint32_t i = 0; i < EFA_RX_BUFS; i++) {
		struct efa_rxbuf *rx = &nic->rx[i];

		rx->op.kind = EFA_OP_RECV;
		rx->buf = nic->msg + EFA_MSG_LEN * (i + 1); /* [0, EFA_MSG_LEN): the hello */
		efa_rx_post(nic, rx);
	}
	return TE_OK;
}

/* fi_getinfo hints for RDM endpoints with RMA of the configured provider (@hmem: FI_HMEM). */
static struct fi_info *efa_hints(const struct efa_inst *ei, bool thread_safe, bool hmem)
{
	struct fi_info *h = fi_allocinfo();

	if (!h)
		return NULL;
	h->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_MSG |
		  FI_SEND | FI_RECV;
	h->mode = FI_CONTEXT | FI_CONTEXT2;
	h->ep_attr->type = FI_EP_RDM;
	/* Every mode this plugin honours; the provider returns the subset it needs. */
	h->domain_attr->mr_mode =
		FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
	if (hmem) {
		/* Descriptors go with every operation anyway: FI_MR_HMEM costs nothing. */
		h->caps |= FI_HMEM;
		h->domain_attr->mr_mode |= FI_MR_HMEM;
	}
	h->domain_attr->threading = thread_safe ? FI_THREAD_SAFE : FI_THREAD_DOMAIN;
	h->domain_attr->av_type = FI_AV_TABLE;
	h->fabric_attr->prov_name = strdup(ei->provider);
	if (!h->fabric_attr->prov_name) {
		fi_freeinfo(h);
		return NULL;
	}
	return h;
}

/* fi_getinfo of the configured provider (NULL with *ret_out on failure). */
static struct fi_info *efa_getinfo(const struct efa_inst *ei, const char *node, bool hmem,
				   int *ret_out)
{
	struct fi_info *list = NULL, *hints;
	int ret = -FI_ENOMEM;

	/* The plugin serializes every call per NIC itself: FI_THREAD_DOMAIN is enough. */
	for (int safe = 0; safe <= 1 && !list; safe++) {
		hints = efa_hints(ei, safe, hmem);
		if (!hints)
			break;
		ret = fi_getinfo(ei->api_version, node, NULL, node ? FI_SOURCE : 0, hints, &list);
		fi_freeinfo(hints);
		if (ret)
			list = NULL;
	}
	if (list && hmem && !(list->caps & FI_HMEM)) {
		fi_freeinfo(list);
		list = NULL;
		ret = -FI_ENODATA;
	}
	*ret_out = ret;
	return list;
}

/*
 * The GPU kinds whose FI_HMEM interface works in the first domain of @list: libfabric answers
 * -FI_ENOSYS (or -FI_EOPNOTSUPP) for an interface it was built without or could not load
 * (Debian's libfabric has no CUDA or ROCr), before it looks at the address, so a host page
 * tells. Other answers leave the kind to reg_mem, which stages a region it cannot register.
 */
static uint32_t efa_hmem_probe(struct efa_inst *ei, struct fi_info *list)
{
	static const uint32_t kinds[] = { TE_PLUGIN_MEM_CUDA, TE_PLUGIN_MEM_HIP };
	struct fid_fabric *fabric = NULL;
	struct fid_domain *domain = NULL;
	uint32_t usable = 0;
	void *page = NULL;
	int ret;

	ret = fi_fabric(list->fabric_attr, &fabric, NULL);
	if (ret == 0)
		ret = fi_domain(fabric, list, &domain, NULL);
	if (ret == 0 && posix_memalign(&page, 4096, 4096) != 0)
		ret = -FI_ENOMEM;
	for (size_t k = 0; ret == 0 && k < TE_PLUGIN_ARRAY_LEN(kinds); k++) {
		struct iovec iov = { .iov_base = page, .iov_len = 4096 };
		struct fi_mr_attr attr = {
			.mr_iov = &iov,
			.iov_count = 1,
			.access = FI_READ | FI_WRITE,
			.iface = efa_hmem_iface(kinds[k]),
			.requested_key = k + 1,
		};
		struct fid_mr *mr = NULL;
		int r = fi_mr_regattr(domain, &attr, 0, &mr);

		if (r == 0)
			fi_close(&mr->fid);
		if (r != -FI_ENOSYS && r != -FI_EOPNOTSUPP)
			usable |= kinds[k];
	}
	if (ret)
		efa_log(ei, TE_PLUGIN_LOG_DEBUG, "FI_HMEM probe of %s: %s",
			list->fabric_attr->prov_name ? list->fabric_attr->prov_name : "?",
			fi_strerror(-ret));
	if (domain)
		fi_close(&domain->fid);
	if (fabric)
		fi_close(&fabric->fid);
	free(page);
	return usable;
}

/* Find the domains, open one NIC per domain (at most EFA_MAX_NICS). */
enum te_status efa_nics_open(struct efa_inst *ei)
{
	const char *node = ei->node[0] ? ei->node : NULL;
	struct fi_info *list = NULL, *pick[EFA_MAX_NICS];
	uint32_t n = 0, want = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);
	enum te_status st;
	int ret = -FI_ENOMEM;

	ei->api_version = EFA_MIN(fi_version(), want);
	/*
	 * GPU memory (FI_HMEM) first where the engine has memory kinds, then host memory only.
	 * An FI_HMEM provider is kept only when one of its GPU interfaces works here.
	 */
	if (TE_PLUGIN_HAS(ei->host, struct te_plugin_host, mem_query) && ei->host->mem_query) {
		list = efa_getinfo(ei, node, true, &ret);
		if (list)
			ei->gpu_types = efa_hmem_probe(ei, list);
		if (list && !ei->gpu_types) {
			fi_freeinfo(list);
			list = NULL;
		}
	}
	if (!list)
		list = efa_getinfo(ei, node, false, &ret);
	if (ret || !list) {
		if (strcmp(ei->provider, "efa") == 0)
			efa_error(ei, "no EFA device found: fi_getinfo(efa): %s",
				  fi_strerror(-ret));
		else
			efa_error(ei,
				  EFA_NAME
				  ": no RDM endpoint with RMA from libfabric provider '%s'%s%s: "
				  "fi_getinfo: %s",
				  ei->provider, node ? " on node " : "", node ? node : "",
				  fi_strerror(-ret));
		return TE_ERR_NO_DEVICE;
	}
	for (struct fi_info *i = list; i && n < EFA_MAX_NICS; i = i->next) {
		bool dup = false;

		if (!i->domain_attr || !i->domain_attr->name || !(i->caps & FI_RMA) ||
		    !efa_device_wanted(ei, i->domain_attr->name))
			continue;
		for (uint32_t k = 0; k < n && !dup; k++)
			dup = strcmp(pick[k]->domain_attr->name, i->domain_attr->name) == 0;
		if (!dup)
			pick[n++] = i;
	}
	if (n == 0) {
		efa_error(ei, EFA_NAME ": provider '%s' has no domain named in 'devices' (%s)",
			  ei->provider, ei->devices ? ei->devices : "");
		fi_freeinfo(list);
		return TE_ERR_NO_DEVICE;
	}
	ei->nics = calloc(n, sizeof(*ei->nics));
	if (!ei->nics) {
		fi_freeinfo(list);
		return TE_ERR_NOMEM;
	}
	for (uint32_t k = 0; k < n; k++) {
		ei->nics[k].ei = ei;
		ei->nics[k].index = k;
		ei->nics[k].wait_fd = -1;
		ei->nics[k].info = fi_dupinfo(pick[k]);
		if (!ei->nics[k].info) {
			fi_freeinfo(list);
			return TE_ERR_NOMEM;
		}
	}
	ei->n_nics = n;
	snprintf(ei->prov_name, sizeof(ei->prov_name), "%s",
		 pick[0]->fabric_attr->prov_name ? pick[0]->fabric_attr->prov_name : ei->provider);
	ei->max_msg = pick[0]->ep_attr->max_msg_size;
	ei->shm = strcmp(ei->prov_name, "shm") == 0;
	/*
	 * How the cancel fence may close connections (efa.h: orphan_wait, read_close_unsafe, rxm):
	 * over TCP (tcp, and net, the same code) their bytes still land after the close; before
	 * libfabric 1.18 tcp completes a READ twice when the connection receiving its response
	 * closes halfway through it (fixed by ofiwg/libfabric#8660); rxm's fi_av_remove crashes
	 * on a connection it holds idle.
	 */
	ei->orphan_wait =
		strncmp(ei->prov_name, "tcp", 3) == 0 || strncmp(ei->prov_name, "net", 3) == 0;
	ei->read_close_unsafe = ei->orphan_wait && fi_version() < FI_VERSION(1, 18);
	ei->rxm = strstr(ei->prov_name, "ofi_rxm") != NULL;
	/* shm and other local-only providers reach peers on this host only. */
	ei->same_host = strncmp(ei->prov_name, "shm", 3) == 0 ||
			((pick[0]->domain_attr->caps & FI_LOCAL_COMM) &&
			 !(pick[0]->domain_attr->caps & FI_REMOTE_COMM));
	fi_freeinfo(list);
	for (uint32_t k = 0; k < n; k++) {
		st = efa_nic_open(ei, &ei->nics[k]);
		if (st == TE_OK)
			st = efa_nic_msg_setup(ei, &ei->nics[k]);
		if (st != TE_OK)
			return st;
	}
	return TE_OK;
}

/* Fill the published blob: magic, version, NIC count, provider name, NIC addresses. */
enum te_status efa_blob(struct efa_inst *ei, uint8_t *blob, size_t *len_out)
{
	size_t plen = strlen(ei->prov_name), off = EFA_BLOB_HDR + plen;

	te_plugin_put_u32(blob, EFA_BLOB_MAGIC);
	blob[4] = 1;
	blob[5] = (uint8_t)ei->n_nics;
	blob[6] = (uint8_t)plen;
	blob[7] = 0;
	memcpy(blob + EFA_BLOB_HDR, ei->prov_name, plen);
	for (uint32_t i = 0; i < ei->n_nics; i++) {
		struct efa_nic *nic = &ei->nics[i];

		if (off + 4 + nic->addrlen > EFA_BLOB_MAX) {
			efa_error(ei, EFA_NAME ": %u NIC addresses do not fit a %u-byte blob",
				  ei->n_nics, EFA_BLOB_MAX);
			return TE_ERR_TOO_LARGE;
		}
		te_plugin_put_u16(blob + off, (uint16_t)nic->addrlen);
		te_plugin_put_u16(blob + off + 2, (uint16_t)(int16_t)nic->numa);
		memcpy(blob + off + 4, nic->addr, nic->addrlen);
		off += 4 + nic->addrlen;
	}
	*len_out = off;
	return TE_OK;
}

void efa_rx_post(struct efa_nic *nic, struct efa_rxbuf *rx)
{
	ssize_t ret;

	efa_nic_lock(nic);
	ret = fi_recv(nic->ep, rx->buf, EFA_MSG_LEN, nic->msg_desc, FI_ADDR_UNSPEC, &rx->op.ctx);
	efa_nic_unlock(nic);
	/* A receive not reposted only means fewer buffers for warm-up messages. */
	if (ret)
		efa_log(nic->ei, TE_PLUGIN_LOG_DEBUG, "%s: fi_recv: %s", nic->name,
			fi_strerror((int)-ret));
}

/* --- AV cache and peers --------------------------------------------------------------- */

int efa_av_remove_locked(struct efa_nic *nic, struct efa_av_entry *e)
{
	if (e->fi_addr == FI_ADDR_NOTAVAIL)
		return 0; /* a fence could not insert it again: nothing to remove */
	/*
	 * The first fi_inject makes rxm connect again; the conn progress it then runs may meet
	 * the peer's rejection of the earlier connect, idling the connection once more: the
	 * second one connects.
	 */
	for (int i = 0; nic->ei->rxm && nic->ep && i < 2; i++) {
		ssize_t rc = fi_inject(nic->ep, nic->msg, EFA_HELLO_LEN, e->fi_addr);

		if (rc && rc != -FI_EAGAIN)
			return (int)rc;
	}
	return fi_av_remove(nic->av, &e->fi_addr, 1, 0);
}

int efa_tcp_orphan(const struct efa_av_entry *e)
{
	struct {
		struct nlmsghdr nlh;
		struct inet_diag_req_v2 req;
	} q;
	struct sockaddr_in in4;
	struct sockaddr_in6 in6;
	uint32_t dst[4] = { 0 };
	sa_family_t family = AF_UNSPEC;
	uint16_t port;
	int fd, found = 0;
	union {
		struct nlmsghdr h;
		uint8_t b[16384];
	} buf;

	if (e->len >= sizeof(family))
		memcpy(&family, e->addr, sizeof(family));
	if (family == AF_INET && e->len >= sizeof(in4)) {
		memcpy(&in4, e->addr, sizeof(in4));
		port = in4.sin_port;
		memcpy(dst, &in4.sin_addr, sizeof(in4.sin_addr));
	} else if (family == AF_INET6 && e->len >= sizeof(in6)) {
		memcpy(&in6, e->addr, sizeof(in6));
		port = in6.sin6_port;
		memcpy(dst, &in6.sin6_addr, sizeof(in6.sin6_addr));
	} else {
		return -1;
	}
	fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (fd < 0)
		return -1;
	memset(&q, 0, sizeof(q));
	q.nlh.nlmsg_len = sizeof(q);
	q.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	q.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	q.req.sdiag_family = (uint8_t)family;
	q.req.sdiag_protocol = IPPROTO_TCP;
	/* Our end closed, the peer's not yet: it may still read what was in flight. */
	q.req.idiag_states = (1u << TCP_FIN_WAIT1) | (1u << TCP_FIN_WAIT2);
	if (send(fd, &q, sizeof(q), 0) != (ssize_t)sizeof(q)) {
		close(fd);
		return -1;
	}
	for (;;) {
		ssize_t n = recv(fd, &buf, sizeof(buf), 0);
		const struct nlmsghdr *h = &buf.h;
		size_t left = n > 0 ? (size_t)n : 0;

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			found = -1;
			break;
		}
		/* NLMSG_OK and NLMSG_NEXT, without their signed length */
		for (; left >= sizeof(*h) && h->nlmsg_len >= sizeof(*h) && h->nlmsg_len <= left;
		     left -= EFA_MIN(left, NLMSG_ALIGN(h->nlmsg_len)),
		     h = (const struct nlmsghdr *)(const void *)((const uint8_t *)h +
								 NLMSG_ALIGN(h->nlmsg_len))) {
			const struct inet_diag_msg *m = NLMSG_DATA(h);

			if (h->nlmsg_type == NLMSG_DONE)
				goto out;
			if (h->nlmsg_type == NLMSG_ERROR) {
				found = -1;
				goto out;
			}
			if (h->nlmsg_len < NLMSG_LENGTH(sizeof(*m)))
				continue;
			if (m->id.idiag_dport == port &&
			    memcmp(m->id.idiag_dst, dst, family == AF_INET ? 4 : 16) == 0)
				found = 1; /* read on to the end of the dump */
		}
	}
out:
	close(fd);
	return found;
}

/* fi_addr of @addr on @nic, inserting it on first use. Under ei->lock. */
static enum te_status efa_av_get_locked(struct efa_nic *nic, const uint8_t *addr, size_t len,
					struct efa_av_entry **entry_out)
{
	struct efa_av_entry *e;
	fi_addr_t fa = FI_ADDR_NOTAVAIL;
	int ret;

	for (uint32_t i = 0; i < nic->n_av; i++) {
		e = nic->av_entries[i];
		if (e->len == len && memcmp(e->addr, addr, len) == 0) {
			e->refs++;
			*entry_out = e;
			return TE_OK;
		}
	}
	if (nic->n_av == nic->cap_av) {
		uint32_t ncap = nic->cap_av ? nic->cap_av * 2 : 16;
		struct efa_av_entry **na = realloc(nic->av_entries, ncap * sizeof(*na));

		if (!na)
			return TE_ERR_NOMEM;
		nic->av_entries = na;
		nic->cap_av = ncap;
	}
	e = calloc(1, sizeof(*e));
	if (!e)
		return TE_ERR_NOMEM;
	efa_nic_lock(nic);
	ret = fi_av_insert(nic->av, addr, 1, &fa, 0, NULL);
	efa_nic_unlock(nic);
	if (ret != 1 || fa == FI_ADDR_NOTAVAIL) {
		free(e);
		efa_error(nic->ei, EFA_NAME ": fi_av_insert on %s: %s", nic->name,
			  ret < 0 ? fi_strerror(-ret) : "address not inserted");
		return TE_ERR_PEER_UNREACHABLE;
	}
	e->fi_addr = fa;
	e->refs = 1;
	e->len = len;
	memcpy(e->addr, addr, len);
	nic->av_entries[nic->n_av++] = e;
	*entry_out = e;
	return TE_OK;
}

/* Drop one reference; the last one removes the address from the AV. Under ei->lock. */
static void efa_av_put_locked(struct efa_nic *nic, struct efa_av_entry *e)
{
	if (--e->refs)
		return;
	for (uint32_t i = 0; i < nic->n_av; i++) {
		if (nic->av_entries[i] == e) {
			nic->av_entries[i] = nic->av_entries[--nic->n_av];
			break;
		}
	}
	efa_nic_lock(nic);
	/* A fence may still hold back posts to it: forget it there. */
	for (uint32_t d = 0; d < nic->n_drain; d++) {
		if (nic->drain[d] == e) {
			nic->drain[d] = nic->drain[--nic->n_drain];
			break;
		}
	}
	/* An endpoint fini left open keeps its connections: closing one is what it avoided. */
	if (!nic->ep_kept)
		(void)efa_av_remove_locked(nic, e);
	efa_nic_unlock(nic);
	free(e);
}

/* Free @peer's AV references and memory. Under ei->lock. */
void efa_peer_free_locked(struct efa_inst *ei, struct efa_peer *peer)
{
	for (uint32_t i = 0; peer->entries && i < ei->n_nics; i++)
		for (uint32_t j = 0; j < peer->n_rnics; j++)
			if (peer->entries[i * peer->n_rnics + j])
				efa_av_put_locked(&ei->nics[i],
						  peer->entries[i * peer->n_rnics + j]);
	if (peer->prev)
		peer->prev->next = peer->next;
	else if (ei->peers == peer)
		ei->peers = peer->next;
	if (peer->next)
		peer->next->prev = peer->prev;
	if (peer->pidfd >= 0)
		close(peer->pidfd);
	free(peer->entries);
	free(peer->hello);
	free(peer->paths);
	free(peer->name);
	free(peer);
}

/*
 * shm: watch the peer's process through a pidfd. Its endpoint name, chosen by its efa_nic_open,
 * says which process it is (te-efa-<pid>-...). A peer named otherwise is not watched.
 */
static void efa_peer_watch(struct efa_inst *ei, struct efa_peer *peer, const uint8_t *addr,
			   size_t len)
{
	char name[EFA_MAX_ADDR + 1];
	const char *n = name;
	int pid = 0;

	memcpy(name, addr, len);
	name[len] = '\0';
	if (strncmp(n, "fi_shm://", 9) == 0)
		n += 9;
	if (sscanf(n, "te-efa-%d-", &pid) != 1 || pid <= 0)
		return;
	peer->pid = pid;
#ifdef SYS_pidfd_open
	peer->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
#endif
	if (peer->pidfd < 0)
		efa_log(ei, TE_PLUGIN_LOG_INFO,
			"peer %s (process %d): no pidfd (%s): a post to it after it died may spin "
			"in the provider",
			peer->name, pid, strerror(errno));
}

/* --- peers ------------------------------------------------------------------------------ */

/* Send one warm-up message per NIC pair so connections exist before the first transfer. */
static void efa_peer_warmup(struct efa_inst *ei, struct efa_peer *peer)
{
	uint64_t deadline = efa_now_ns() + ei->connect_timeout_ms * 1000000ull;

	for (uint32_t k = 0; k < peer->n_hello; k++) {
		struct efa_hello *h = &peer->hello[k];
		struct efa_nic *nic = &ei->nics[h->nic];
		const struct efa_av_entry *e = peer->entries[h->nic * peer->n_rnics + h->rnic];
		ssize_t ret;

		h->op.kind = EFA_OP_HELLO;
		h->peer = peer;
		atomic_fetch_add_explicit(&peer->refs, 1, memory_order_relaxed);
		for (;;) {
			efa_nic_lock(nic);
			ret = e->fi_addr == FI_ADDR_NOTAVAIL
				      ? -FI_EADDRNOTAVAIL
				      : fi_send(nic->ep, nic->msg, EFA_HELLO_LEN, nic->msg_desc,
						e->fi_addr, &h->op.ctx);
			efa_nic_unlock(nic);
			/* -FI_EAGAIN while the connection is set up: the progress thread runs it. */
			if (ret != -FI_EAGAIN || efa_now_ns() >= deadline)
				break;
			efa_prog_kick(nic->prog);
			usleep(100);
		}
		if (ret) {
			atomic_fetch_sub_explicit(&peer->refs, 1, memory_order_relaxed);
			efa_log(ei, TE_PLUGIN_LOG_INFO,
				"%s: warm-up message to %s (remote NIC %u) not sent: %s", nic->name,
				peer->name, h->rnic, fi_strerror((int)-ret));
			if (ret == -FI_EAGAIN)
				break; /* out of time for the others too */
		} else {
			efa_prog_kick(nic->prog);
		}
	}
}

enum te_status efa_load_peer(struct te_plugin_inst *inst, const char *peer_name, const void *blob,
			     size_t len, struct te_plugin_peer **peer_out)
{
	struct efa_inst *ei = efa_inst_of(inst);
	const uint8_t *b = blob;
	const uint8_t *raddr[EFA_MAX_NICS];
	size_t rlen[EFA_MAX_NICS], off;
	char prov[EFA_MAX_PROV + 1];
	struct efa_peer *peer;
	uint32_t n_r, pairs;
	enum te_status st = TE_OK;

	if (!peer_name || !peer_out || (len && !blob))
		return TE_ERR_INVALID_ARG;
	if (len < EFA_BLOB_HDR || te_plugin_get_u32(b) != EFA_BLOB_MAGIC || b[4] != 1 ||
	    b[5] == 0 || b[5] > EFA_MAX_NICS || b[6] == 0 || b[6] > EFA_MAX_PROV ||
	    len < EFA_BLOB_HDR + (size_t)b[6])
		goto err_malformed;
	n_r = b[5];
	memcpy(prov, b + EFA_BLOB_HDR, b[6]);
	prov[b[6]] = '\0';
	off = EFA_BLOB_HDR + b[6];
	for (uint32_t j = 0; j < n_r; j++) {
		if (len - off < 4)
			goto err_malformed;
		rlen[j] = te_plugin_get_u16(b + off);
		if (rlen[j] == 0 || rlen[j] > EFA_MAX_ADDR || len - off - 4 < rlen[j])
			goto err_malformed;
		raddr[j] = b + off + 4;
		off += 4 + rlen[j];
	}
	if (off != len)
		goto err_malformed;
	if (strcmp(prov, ei->prov_name) != 0) {
		efa_error(ei,
			  EFA_NAME ": peer %s uses libfabric provider '%s', this engine '%s': they "
				   "cannot reach each other",
			  peer_name, prov, ei->prov_name);
		return TE_ERR_PEER_UNREACHABLE;
	}

	peer = calloc(1, sizeof(*peer));
	if (!peer)
		return TE_ERR_NOMEM;
	peer->ei = ei;
	peer->n_rnics = n_r;
	peer->name = strdup(peer_name);
	peer->entries = calloc((size_t)ei->n_nics * n_r, sizeof(*peer->entries));
	peer->paths = calloc(ei->n_nics, sizeof(*peer->paths));
	peer->pidfd = -1;
	pairs = ei->n_nics * n_r <= EFA_HELLO_PAIRS ? ei->n_nics * n_r : ei->n_nics;
	peer->hello = ei->warmup ? calloc(pairs, sizeof(*peer->hello)) : NULL;
	if (!peer->name || !peer->entries || !peer->paths || (ei->warmup && !peer->hello)) {
		free(peer->name);
		free(peer->entries);
		free(peer->paths);
		free(peer->hello);
		free(peer);
		return TE_ERR_NOMEM;
	}
	atomic_init(&peer->refs, 1);
	if (ei->shm)
		efa_peer_watch(ei, peer, raddr[0], rlen[0]);
	pthread_mutex_lock(&ei->lock);
	peer->next = ei->peers;
	if (ei->peers)
		ei->peers->prev = peer;
	ei->peers = peer;
	for (uint32_t i = 0; i < ei->n_nics && st == TE_OK; i++) {
		for (uint32_t j = 0; j < n_r && st == TE_OK; j++) {
			struct efa_av_entry *e = NULL;

			st = efa_av_get_locked(&ei->nics[i], raddr[j], rlen[j], &e);
			if (st == TE_OK)
				peer->entries[i * n_r + j] = e;
		}
	}
	if (st != TE_OK) {
		efa_peer_free_locked(ei, peer);
		pthread_mutex_unlock(&ei->lock);
		return st;
	}
	pthread_mutex_unlock(&ei->lock);
	if (ei->warmup) {
		for (uint32_t i = 0; i < ei->n_nics; i++) {
			for (uint32_t j = 0; j < n_r; j++) {
				if (pairs != ei->n_nics * n_r && j != i % n_r)
					continue;
				peer->hello[peer->n_hello++] =
					(struct efa_hello){ .nic = i, .rnic = j };
			}
		}
		efa_peer_warmup(ei, peer);
	}
	efa_log(ei, TE_PLUGIN_LOG_DEBUG, "peer %s: %u NIC(s), %u warm-up message(s)", peer_name,
		n_r, peer->n_hello);
	*peer_out = (struct te_plugin_peer *)peer;
	return TE_OK;

err_malformed:
	efa_error(ei, EFA_NAME ": peer %s: malformed transport blob (%zu bytes)", peer_name, len);
	return TE_ERR_METADATA_MALFORMED;
}

void efa_unload_peer(struct te_plugin_inst *inst, struct te_plugin_peer *handle)
{
	struct efa_inst *ei = efa_inst_of(inst);
	struct efa_peer *peer = (struct efa_peer *)handle;

	if (!peer)
		return;
	/* Slices and warm-up messages still in flight keep it until they complete. */
	efa_peer_unref(ei, peer);
}
