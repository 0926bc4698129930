/* SPDX-License-Identifier: Apache-2.0 */
/* control.h: the engine's side of the control plane: serving peers and calling them. */
#ifndef TE_CORE_CONTROL_H
#define TE_CORE_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#include <glib.h>

#include <te/te.h>

struct engine;
struct batch;
struct descriptor;

/* Start the listener and the client (engine start). On failure *err_out says why. */
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

/*
 * control_fetch_descriptor - the descriptor of segment @name from the metadata
 * backend (decoded). TE_ERR_UNKNOWN_SEGMENT / TE_ERR_METADATA_* with detail.
 */
enum te_status control_fetch_descriptor(struct engine *e, const char *name, uint32_t timeout_ms,
					struct descriptor **desc_out, char **err_out);

/* A batch armed with a notify became terminal with every task COMPLETED. */
void control_queue_notify(struct engine *e, const char *addr, GBytes *msg);

/* Worker: send queued notifies; returns how many were handled. */
unsigned control_send_notifies(struct engine *e);

/* Host service for plugins: a handshake with @peer_name's engine. */
enum te_status control_peer_handshake(struct engine *e, const char *plugin, const char *peer_name,
				      const void *req, size_t len, void *resp, size_t cap,
				      size_t *resp_len_out, uint32_t timeout_ms);

/* Set while segview_new loads peers of @d on this thread (handshake routing). */
void control_set_loading(const struct descriptor *d);

#endif /* TE_CORE_CONTROL_H */
