/* SPDX-License-Identifier: Apache-2.0 */
/*
 * control.h: the engine's side of the control plane: serving peers and calling them.
 * A layer below segment.c and metadata/: it calls neither. It serves this engine's
 * descriptor through engine->describe_local and calls peers at addresses its callers
 * resolved (segment_resolve_address).
 */
#ifndef TE_CORE_CONTROL_H
#define TE_CORE_CONTROL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <glib.h>

#include <te/te.h>

struct engine;
struct batch;

/*
 * Start the listener and the client (engine start; e->describe_local set before). On
 * failure *err_out says why.
 */
enum te_status control_start(struct engine *e, char **err_out);

/*
 * control_secret_load - read the shared secret of auth.secret_file at @path: a
 * regular file, neither readable nor writable by group or others, at most
 * RPC_MAX_SECRET bytes, read as bytes (NUL included) with one final "\n" or "\r\n"
 * dropped, then at least CONFIG_MIN_SECRET bytes. TE_OK: *secret_out (g_free after
 * explicit_bzero) holds *len_out bytes. TE_ERR_CONFIG: *err_out says what, where
 * and why ("auth.secret_file: <path> is ..."). Reads at most RPC_MAX_SECRET + 1
 * bytes, whatever the file is. Thread-safe.
 */
enum te_status control_secret_load(const char *path, char **secret_out, size_t *len_out,
				   char **err_out);

/* Stop serving and free the client (engine teardown). */
void control_stop(struct engine *e);

/* The address peers reach this engine's control plane at ("" if none). */
const char *control_address(const struct engine *e);
/* What the listener bound ("0.0.0.0:7000" for a wildcard), or "" without one. */
const char *control_bound_address(const struct engine *e);
/* The host's first up, non-loopback IPv4 address (g_free), or NULL: what a wildcard listener
 * advertises when engine.advertise is not set. */
char *control_first_ipv4(void);

/* A batch armed with a notify became terminal with every task COMPLETED. */
void control_queue_notify(struct engine *e, const char *addr, GBytes *msg);

/* Worker: send queued notifies; returns how many were handled. */
unsigned control_send_notifies(struct engine *e);
/* The same, giving up (messages left queued) once engine_now_ns() passes @give_up_ns. */
unsigned control_send_notifies_until(struct engine *e, uint64_t give_up_ns);

/* Host service for plugins: a handshake with @peer_name's engine, served at @addr. */
enum te_status control_peer_handshake(struct engine *e, const char *plugin, const char *peer_name,
				      const char *addr, const void *req, size_t len, void *resp,
				      size_t cap, size_t *resp_len_out, uint32_t timeout_ms);

/*
 * control_probe - ask the control plane at @addr whether it is alive (te_peer_probe).
 * TE_OK: *has_gen_out says whether the reply named the peer's generation, then in
 * *gen_out. TE_ERR_TIMEOUT: no answer within @timeout_ms. TE_ERR_PEER_UNREACHABLE:
 * *err_out (g_free) says why.
 */
enum te_status control_probe(struct engine *e, const char *addr, uint32_t timeout_ms,
			     uint64_t *gen_out, bool *has_gen_out, char **err_out);

#endif /* TE_CORE_CONTROL_H */
