/* SPDX-License-Identifier: Apache-2.0 */
/* rdma_verbs.h: the table of libibverbs calls the rdma plugin makes, so tests can inject faults. */
#ifndef TE_PLUGINS_RDMA_VERBS_H
#define TE_PLUGINS_RDMA_VERBS_H

#include <infiniband/verbs.h>

/*
 * Every verbs call of the plugin goes through one of these pointers. The plugin built for
 * production uses rdma_verbs_real (plain libibverbs); the unit tests build the same source
 * against a software fabric (tests/rdma/fakeverbs.c) that can fail any call or complete any
 * work request with any ibv_wc_status. Several calls are static inline functions or macros
 * in <infiniband/verbs.h> (post_send, poll_cq, req_notify_cq, query_port, query_gid_table),
 * which is why link-time wrapping cannot replace this table.
 *
 * Semantics and return values are those of the libibverbs function of the same name.
 * reg_dmabuf_mr may be NULL: a libibverbs older than rdma-core v34 has no ibv_reg_dmabuf_mr.
 */
struct rdma_verbs {
	struct ibv_device **(*get_device_list)(int *num_devices);
	void (*free_device_list)(struct ibv_device **list);
	const char *(*get_device_name)(struct ibv_device *device);
	struct ibv_context *(*open_device)(struct ibv_device *device);
	int (*close_device)(struct ibv_context *context);
	int (*query_device)(struct ibv_context *context, struct ibv_device_attr *attr);
	int (*query_port)(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr);
	/* Valid GID entries of every port; returns the count or a negative errno. */
	ssize_t (*query_gid_table)(struct ibv_context *context, struct ibv_gid_entry *entries,
				   size_t max_entries);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *context);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *context);
	int (*destroy_comp_channel)(struct ibv_comp_channel *channel);
	struct ibv_cq *(*create_cq)(struct ibv_context *context, int cqe, void *cq_context,
				    struct ibv_comp_channel *channel, int comp_vector);
	int (*destroy_cq)(struct ibv_cq *cq);
	int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
	int (*get_cq_event)(struct ibv_comp_channel *channel, struct ibv_cq **cq,
			    void **cq_context);
	void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
	/* Device memory through a dmabuf fd (GPUDirect): bytes [@offset, +@length) of @fd,
	 * addressed by work requests and peers as [@iova, +@length). */
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t length,
					uint64_t iova, int fd, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
	int (*destroy_qp)(struct ibv_qp *qp);
	int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
	int (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
	int (*get_async_event)(struct ibv_context *context, struct ibv_async_event *event);
	void (*ack_async_event)(struct ibv_async_event *event);
};

/* Plain libibverbs (rdma_verbs.c). */
extern const struct rdma_verbs rdma_verbs_real;

#endif /* TE_PLUGINS_RDMA_VERBS_H */
