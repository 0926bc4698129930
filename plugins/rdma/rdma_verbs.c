/* SPDX-License-Identifier: Apache-2.0 */
/* rdma_verbs.c: the verbs call table bound to libibverbs itself. */
#include "rdma_verbs.h"

/* Wrappers for what <infiniband/verbs.h> defines inline or as a macro. */

static int rdma_real_query_port(struct ibv_context *context, uint8_t port,
				struct ibv_port_attr *attr)
{
	return ibv_query_port(context, port, attr);
}

static ssize_t rdma_real_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
					 size_t max_entries)
{
	return ibv_query_gid_table(context, entries, max_entries, 0);
}

static int rdma_real_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq, solicited_only);
}

static int rdma_real_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
			       struct ibv_send_wr **bad_wr)
{
	return ibv_post_send(qp, wr, bad_wr);
}

static int rdma_real_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, num_entries, wc);
}

static struct ibv_mr *rdma_real_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr(pd, addr, length, access);
}

const struct rdma_verbs rdma_verbs_real = {
	.get_device_list = ibv_get_device_list,
	.free_device_list = ibv_free_device_list,
	.get_device_name = ibv_get_device_name,
	.open_device = ibv_open_device,
	.close_device = ibv_close_device,
	.query_device = ibv_query_device,
	.query_port = rdma_real_query_port,
	.query_gid_table = rdma_real_query_gid_table,
	.alloc_pd = ibv_alloc_pd,
	.dealloc_pd = ibv_dealloc_pd,
	.create_comp_channel = ibv_create_comp_channel,
	.destroy_comp_channel = ibv_destroy_comp_channel,
	.create_cq = ibv_create_cq,
	.destroy_cq = ibv_destroy_cq,
	.req_notify_cq = rdma_real_req_notify_cq,
	.get_cq_event = ibv_get_cq_event,
	.ack_cq_events = ibv_ack_cq_events,
	.reg_mr = rdma_real_reg_mr,
#ifdef RDMA_HAVE_REG_DMABUF_MR
	.reg_dmabuf_mr = ibv_reg_dmabuf_mr,
#endif
	.dereg_mr = ibv_dereg_mr,
	.create_qp = ibv_create_qp,
	.modify_qp = ibv_modify_qp,
	.destroy_qp = ibv_destroy_qp,
	.post_send = rdma_real_post_send,
	.poll_cq = rdma_real_poll_cq,
	.get_async_event = ibv_get_async_event,
	.ack_async_event = ibv_ack_async_event,
};
