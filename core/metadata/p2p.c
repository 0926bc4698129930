/* SPDX-License-Identifier: Apache-2.0 */
/* p2p.c: the embedded default backend: descriptors come from the peer's own listener. */
#include <string.h>

#include "core/engine.h"
#include "core/metadata/metadata.h"
#include "core/rpc.h"

/* A peer's listener answers a descriptor fetch within this when the caller gives no limit. */
#define P2P_FETCH_TIMEOUT_MS 5000u

static enum te_status p2p_open(const struct metadata_params *p, void **state_out, char **err_out)
{
	(void)err_out;
	*state_out = p->engine;
	return TE_OK;
}

static enum te_status p2p_get(void *state, const char *name, uint32_t timeout_ms, GBytes **json_out,
			      char **err_out)
{
	struct engine *e = state;
	g_autofree char *err = NULL;
	GBytes *reply = NULL;
	int32_t status = 0;
	enum te_status st;

	if (!strchr(name, ':')) {
		*err_out = g_strdup_printf(
			"p2p metadata: segment name '%s' is not a host:port address of a peer's "
			"control plane; with p2p metadata a segment is opened by the address its "
			"engine listens on (engine.listen), or configure a store (metadata.type: "
			"etcd, redis or http) to open segments by engine name",
			name);
		return TE_ERR_UNKNOWN_SEGMENT;
	}
	st = rpc_client_call(e->rpc_client, name, RPC_DESC_FETCH, NULL, 0,
			     timeout_ms ? timeout_ms : P2P_FETCH_TIMEOUT_MS, &reply, &status, &err);
	if (st != TE_OK) {
		*err_out = g_strdup_printf("p2p metadata: fetching segment '%s': %s", name,
					   err ? err : te_status_str(st));
		return st == TE_ERR_PEER_UNREACHABLE ? TE_ERR_UNKNOWN_SEGMENT : st;
	}
	if (status != TE_OK) {
		*err_out = g_strdup_printf("p2p metadata: peer %s refused the descriptor: %s", name,
					   te_status_str(status));
		g_bytes_unref(reply);
		return TE_ERR_METADATA;
	}
	*json_out = reply;
	return TE_OK;
}

/* Nothing to store: our listener serves the current descriptor on demand. */
static enum te_status p2p_publish(void *state, const char *name, const char *json, size_t len,
				  char **err_out)
{
	(void)state;
	(void)name;
	(void)json;
	(void)len;
	(void)err_out;
	return TE_OK;
}

static enum te_status p2p_withdraw(void *state, const char *name, char **err_out)
{
	(void)state;
	(void)name;
	(void)err_out;
	return TE_OK;
}

static void p2p_close(void *state)
{
	(void)state;
}

const struct metadata_ops metadata_p2p_ops = {
	.name = "p2p",
	.open = p2p_open,
	.get = p2p_get,
	.publish = p2p_publish,
	.withdraw = p2p_withdraw,
	.watch = NULL, /* peers learn of a restart from the generation in their replies */
	.close = p2p_close,
};
