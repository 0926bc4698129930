/* SPDX-License-Identifier: Apache-2.0 */
/* config.h: the engine's YAML configuration, parsed by a pure function. */
#ifndef TE_CORE_CONFIG_H
#define TE_CORE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <te/te_status.h>

#define CONFIG_MAX_TRANSPORTS 16
#define CONFIG_MAX_OPTIONS 64
#define CONFIG_MAX_ENDPOINTS 8
/* Longest configuration text config_parse accepts, in bytes. */
#define CONFIG_MAX_INPUT (1024 * 1024)
/* Longest scalar (key or value) in bytes; longer ones are errors, never truncated. */
#define CONFIG_MAX_STRING 4096

/* One key/value of a transport's options map; values are kept as scalar text. */
struct config_option {
	char *key;
	char *value;
	bool null;		    /* the YAML value was null (value is ""): "keep the default" */
	unsigned key_line, key_col; /* where the key is (1-based); 0: a default filled in */
	unsigned value_line, value_col; /* where the value is */
};

struct config_transport {
	char *name; /* plugin name (module file stem) */
	char *path; /* explicit module path or NULL */
	bool required;
	bool memory_only; /* loaded for the memory kinds it owns; never chosen to move bytes */
	struct config_option *options;
	size_t n_options;
	unsigned line, col;	      /* the transport's mapping in the YAML; 0: not from YAML */
	unsigned opts_line, opts_col; /* its options: mapping; 0: none */
};

enum config_metadata_type {
	CONFIG_METADATA_P2P = 0,
	CONFIG_METADATA_ETCD,
	CONFIG_METADATA_REDIS,
	CONFIG_METADATA_HTTP,
};

struct config {
	char *source; /* the name errors start with (file name, "<string>") */

	/* engine: */
	char *name;	 /* NULL: host:port of the listener */
	char *listen;	 /* control-plane address, default "127.0.0.1:0" */
	char *advertise; /* host peers reach the listener at; NULL: derived */

	/* metadata: */
	enum config_metadata_type metadata_type;
	char *metadata_endpoints[CONFIG_MAX_ENDPOINTS];
	size_t n_metadata_endpoints;
	char *metadata_namespace;     /* default "/te" */
	uint32_t metadata_ttl_s;      /* default 10 */
	char *metadata_username;      /* NULL: none */
	char *metadata_password_file; /* NULL: none */
	char *metadata_ca_file;	      /* NULL: the system's CAs */
	uint32_t metadata_timeout_ms; /* one request to the store, default 3000 */

	/* transfer: */
	uint64_t slice_size;	       /* 0: from the transport's caps */
	uint32_t max_slices_per_task;  /* default 4096 */
	uint32_t retries;	       /* extra attempts per slice, default 3 */
	uint64_t retry_backoff_us;     /* first backoff, doubles, default 100 */
	uint64_t retry_backoff_max_us; /* default 100000 */
	uint64_t timeout_ms;	       /* per task deadline, default 30000 */
	uint64_t quarantine_ms;	       /* pause after mark_failed, default 1000 */
	uint32_t quarantine_after;     /* consecutive failures before quarantine, default 3 */
	uint64_t cancel_grace_ms;      /* a canceled slice's transport must hand it back by
					* max(cancel, deadline) + this, default 2000 */
	uint32_t worker_threads;       /* default 1 */
	uint32_t max_pollers;	       /* waiters polling a per-thread hybrid transport at
					* once; 0 (default): half the CPUs, at least 1 */
	uint32_t max_batches;	       /* live batch slots, default 1024 */
	uint32_t max_batch_size;       /* requests per batch, default 65536 */
	bool fallback;		       /* may retry on a lower-priority transport */

	/* transports: (in priority order) */
	struct config_transport transports[CONFIG_MAX_TRANSPORTS];
	size_t n_transports;

	/* control: limits of the control-plane listener (docs/config.md, "control") */
	uint32_t control_max_connections;	   /* default 1024 */
	uint32_t control_max_connections_per_host; /* default 128 */
	uint32_t control_max_unauthenticated;	   /* default 256 */
	uint32_t control_auth_timeout_ms;	   /* default 5000, from accept */
	uint32_t control_idle_timeout_ms;	   /* default 10000 */
	uint32_t control_frame_timeout_ms;	   /* default 10000, from a frame's first byte */
	uint64_t control_max_frame;		   /* body bytes of one frame, default 16M */
	uint64_t control_max_buffered;		   /* body bytes of all frames held, default 64M */
	uint32_t control_notify_inbox;		   /* received notifies held, default 65536 */
	uint32_t control_notify_per_sender;	   /* ... per (source address, sender), 1024 */
	uint32_t control_notify_per_host;	   /* ... per source address, default 8192 */

	/* log: */
	int log_level; /* enum te_log_level, default TE_LOG_WARN */

	/* auth: */
	/* At most one of these is set; both NULL: no authentication. */
	char *auth_secret;	/* auth.secret: the secret itself, >= CONFIG_MIN_SECRET bytes */
	char *auth_secret_file; /* auth.secret_file: path the engine reads the secret from */
};

/* Shortest shared secret, in bytes (auth.secret, and auth.secret_file's content). */
#define CONFIG_MIN_SECRET 16

/*
 * config_parse - parse and validate YAML @buf of @len bytes (need not be
 * NUL-terminated). @name is used in error messages ("<file>:line:col: ...").
 * On success *cfg_out is a new config (config_free). On failure returns
 * TE_ERR_CONFIG (or TE_ERR_NOMEM) and *err_out is a new string (g_free) naming
 * file:line:column, the key path and the reason (@err_out may be NULL).
 * Pure: no I/O, no globals. Thread-safe. docs/config.md lists keys and messages.
 */
enum te_status config_parse(const char *buf, size_t len, const char *name, struct config **cfg_out,
			    char **err_out);

/*
 * Read @path (at most CONFIG_MAX_INPUT bytes) and parse it with @path as the name.
 * I/O errors read "<path>: cannot read: <reason>" and return TE_ERR_CONFIG.
 */
enum te_status config_load_file(const char *path, struct config **cfg_out, char **err_out);

/* The built-in default: p2p metadata, tcp transport on loopback. */
extern const char config_default_yaml[];

/*
 * Effective configuration (every key, defaults filled in) as YAML text (g_free) that
 * config_parse reads back to the same configuration. auth.secret is printed verbatim:
 * redact it before showing the text to a user. NULL for a NULL @cfg.
 */
char *config_to_yaml(const struct config *cfg);

struct te_plugin_option;

/*
 * config_option_normalize - check @text against the plugin option declaration @decl
 * (te_plugin.h, "Declared options"). TE_OK with *normal_out (g_free) in normal form ("true",
 * "-3", "65536", the choice); TE_ERR_CONFIG with *reason_out (g_free), e.g. "expected an
 * integer, got \"x\"" or "value 0 out of range 1..16". Pure; thread-safe.
 */
enum te_status config_option_normalize(const struct te_plugin_option *decl, const char *text,
				       char **normal_out, char **reason_out);

/*
 * config_transport_apply - check the options of transport @t (transports[@index] of the
 * configuration named @source) against the @n declarations @decls of plugin @plugin, and
 * replace them with the effective options: every declared option that has a value (the YAML's
 * normalized, else its default), in declaration order. With @check_required, a
 * TE_PLUGIN_OPT_REQUIRED option without a value is an error. TE_OK; TE_ERR_CONFIG with
 * *err_out (g_free) "<source>:<line>:<col>: transports[<index>].options.<key>: <reason>", @t
 * untouched. The caller validated @decls (plugin_validate_options); @n 0 changes nothing.
 */
enum te_status config_transport_apply(struct config_transport *t, const char *source, size_t index,
				      const char *plugin, const struct te_plugin_option *decls,
				      size_t n, bool check_required, char **err_out);

/* config_apply_options - config_transport_apply on cfg->transports[@index], required checked. */
enum te_status config_apply_options(struct config *cfg, size_t index, const char *plugin,
				    const struct te_plugin_option *decls, size_t n, char **err_out);

/*
 * config_option_error - when @text (what a plugin's init said through set_error) reads
 * "[<plugin>: ]option '<key>': <why>", the one convention for option errors plugins find
 * themselves, *out_out (g_free) is "<source>:<line>:<col>: transports[<index>].options.<key>:
 * <why>" (at the key's value, else at the transport's options) and true; false otherwise.
 */
bool config_option_error(const struct config *cfg, size_t index, const char *plugin,
			 const char *text, char **out_out);

/* Free what @t holds and zero it (for a transport built outside config_parse). */
void config_transport_clear(struct config_transport *t);

/* Look up a transport option; NULL if absent. */
const char *config_transport_option(const struct config_transport *t, const char *key);

void config_free(struct config *cfg);

#endif /* TE_CORE_CONFIG_H */
