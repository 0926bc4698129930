/* SPDX-License-Identifier: Apache-2.0 */
/* fakeverbs.h: a software RDMA fabric for the rdma plugin's verbs table, with fault injection. */
#ifndef TE_TESTS_RDMA_FAKEVERBS_H
#define TE_TESTS_RDMA_FAKEVERBS_H

#include <stdbool.h>
#include <stdint.h>

#include <infiniband/verbs.h>

/*
 * One process-wide fabric (the test and the test build of rdma.so share this library).
 * Devices are RoCE ports; every QP can reach every other QP of the fabric. Work requests
 * run on a fabric thread: RDMA READ/WRITE are memcpy between registered regions, checked
 * like hardware does (rkey, range, access, PD). Errors move the QP to the error state and
 * flush its queue, as verbs do. Thread-safe.
 *
 * reg_dmabuf_mr maps the dmabuf fd (any mmap-able fd: the tests' fake GPU hands out memfds)
 * at the given offset, MAP_SHARED, and keeps the mapping until dereg_mr: work requests
 * address the region by its iova, the fabric copies to and from the mapping, so device
 * pointers that fault on CPU access work as they would with a real NIC.
 */

#define FAKEVERBS_MAX_GIDS 8

struct fakeverbs_dev_opts {
	enum ibv_mtu mtu;     /* active MTU (default 4096) */
	uint64_t max_mr_size; /* default 2^40 */
	uint32_t max_msg;     /* port max_msg_sz (default 1 GiB) */
	bool down;	      /* port starts down */
	uint32_t n_gids;      /* 0: one RoCE v2 IPv4-mapped GID 10.0.0.<index> */
	union ibv_gid gids[FAKEVERBS_MAX_GIDS];
	enum ibv_gid_type gid_types[FAKEVERBS_MAX_GIDS];
};

enum fakeverbs_call {
	FAKEVERBS_POST_SEND,
	FAKEVERBS_CREATE_QP,
	FAKEVERBS_REG_MR,
	FAKEVERBS_MODIFY_QP,
	FAKEVERBS_REG_DMABUF_MR, /* e.g. EOPNOTSUPP: a provider or device without dmabuf */
	FAKEVERBS_N_CALLS,
};

/* Remove every device (only when no context is open) and clear all faults and counters. */
void fakeverbs_reset(void);
/* Add a device; @o may be NULL for defaults. */
void fakeverbs_add_device(const char *name, const struct fakeverbs_dev_opts *o);
/* The @nth work request (1-based, counted from now) posted on @dev completes with @st. */
void fakeverbs_fail_wr(const char *dev, uint64_t nth, enum ibv_wc_status st);
/* Port state of @dev: queues PORT_ERR / PORT_ACTIVE to every context; while down, work
 * from or to the device ends with IBV_WC_RETRY_EXC_ERR. */
void fakeverbs_set_port(const char *dev, bool up);
/* IBV_EVENT_DEVICE_FATAL on @dev; its work ends with IBV_WC_FATAL_ERR from then on. */
void fakeverbs_device_fatal(const char *dev);
/* The next @count calls of @call return (or set errno to) @err. */
void fakeverbs_fail_call(enum fakeverbs_call call, int err, uint32_t count);
/* The same after @skip calls that succeed. */
void fakeverbs_fail_call_after(enum fakeverbs_call call, int err, uint32_t skip, uint32_t count);
/* Stop (true) or resume executing work requests: lets a test pile them up. */
void fakeverbs_hold(bool hold);
/* Block until no work request is queued on the fabric (at most 10 s). */
void fakeverbs_settle(void);

/* Counters. */
uint64_t fakeverbs_wrs(const char *dev);	 /* work requests executed from @dev */
uint64_t fakeverbs_posts(const char *dev);	 /* ibv_post_send calls on @dev */
uint32_t fakeverbs_qps_created(const char *dev); /* QPs created on @dev so far */
uint32_t fakeverbs_qps_live(const char *dev);
uint32_t fakeverbs_mrs_live(const char *dev);
/* MRs of @dev registered through reg_dmabuf_mr so far, and those still registered. */
uint32_t fakeverbs_dmabuf_mrs(const char *dev);
uint32_t fakeverbs_dmabuf_mrs_live(const char *dev);
/* QPs of @dev moved to the error state by ibv_modify_qp (not by a failed request). */
uint32_t fakeverbs_qps_errored(const char *dev);
/* Work requests of @dev that such a move flushed before they ran (held or queued). */
uint64_t fakeverbs_flushed_queued(const char *dev);
/* Path MTU and source GID index of the last QP of @dev moved to RTR (-1: none). */
int fakeverbs_last_mtu(const char *dev);
int fakeverbs_last_sgid_index(const char *dev);

#endif /* TE_TESTS_RDMA_FAKEVERBS_H */
