/* SPDX-License-Identifier: Apache-2.0 */
/* te_status.h: status codes shared by the te engine API and the plugin ABI. */
#ifndef TE_STATUS_H
#define TE_STATUS_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TE_API __attribute__((visibility("default")))
#define TE_NODISCARD __attribute__((warn_unused_result))
#else
#define TE_API
#define TE_NODISCARD
#endif

/*
 * Status of an operation. TE_OK is 0, TE_INPROGRESS is 1, errors are negative.
 * Values are fixed forever (they cross the plugin ABI and may be logged or stored)
 * and grouped by blast radius:
 *   -1..-39    argument: the caller's request is wrong; retrying it cannot help
 *   -40..-59   path/link: transient failure of one path; the core may retry
 *   -60..-79   peer: the remote engine refused or is gone
 *   -80..-99   metadata: descriptor store or descriptor content
 *   -100..-119 plugin, ABI and configuration
 *   -120..-139 system: memory, OS calls, deadlines, shutdown
 */
enum te_status {
	TE_OK = 0,
	TE_INPROGRESS = 1,

	TE_ERR_INVALID_ARG = -1,	/* NULL, zero or malformed argument */
	TE_ERR_INVALID_HANDLE = -2,	/* unknown, stale or forged handle */
	TE_ERR_OVERFLOW = -3,		/* address + length wraps around */
	TE_ERR_ADDRESS_OVERLAPPED = -4, /* overlaps a registered region */
	TE_ERR_NOT_REGISTERED = -5,	/* memory not registered with the engine */
	TE_ERR_OUT_OF_RANGE = -6,	/* range exceeds the registered region */
	TE_ERR_UNKNOWN_SEGMENT = -7,	/* no such segment id or name */
	TE_ERR_BATCH_FULL = -8,		/* more requests than the batch capacity */
	TE_ERR_BUSY = -9,		/* object still in use (in-flight transfers) */
	TE_ERR_TOO_LARGE = -10,		/* size over a configured limit */
	TE_ERR_EXISTS = -11,		/* name already present */
	TE_ERR_NOT_FOUND = -12,		/* generic lookup failure */

	TE_ERR_LINK_DOWN = -40,	    /* link or port down */
	TE_ERR_CONN_RESET = -41,    /* connection broken while in flight */
	TE_ERR_TRANSIENT = -42,	    /* transient path error, try again */
	TE_ERR_AGAIN = -43,	    /* resource temporarily exhausted */
	TE_ERR_DEVICE_FAILED = -44, /* local device error; another device may work */
	TE_ERR_PATH_TIMEOUT = -45,  /* one attempt on a path timed out */

	TE_ERR_PEER_UNREACHABLE = -60, /* cannot connect to the peer */
	TE_ERR_REMOTE_ACCESS = -61,    /* remote range outside the peer's buffers */
	TE_ERR_PEER_REJECTED = -62,    /* peer refused the request */
	TE_ERR_PEER_RESTARTED = -63,   /* peer generation changed */
	TE_ERR_PROTOCOL = -64,	       /* malformed or unexpected wire frame */
	TE_ERR_AUTH = -65,	       /* authentication failed */
	TE_ERR_NO_TRANSPORT = -66,     /* no installed transport reaches the peer */
	TE_ERR_PEER_QUARANTINED = -67, /* peer or path paused after failures */

	TE_ERR_METADATA = -80,		   /* metadata backend error */
	TE_ERR_METADATA_NOT_FOUND = -81,   /* no descriptor under that name */
	TE_ERR_METADATA_MALFORMED = -82,   /* descriptor failed to decode */
	TE_ERR_METADATA_UNAVAILABLE = -83, /* backend unreachable */

	TE_ERR_UNSUPPORTED = -100,	/* operation not supported by this plugin */
	TE_ERR_PLUGIN_NOT_FOUND = -101, /* plugin file missing */
	TE_ERR_PLUGIN_INVALID = -102,	/* not a plugin (no entry, bad descriptor) */
	TE_ERR_ABI_MISMATCH = -103,	/* wrong major or newer minor */
	TE_ERR_PLUGIN_INIT = -104,	/* plugin init failed */
	TE_ERR_CONFIG = -105,		/* configuration error */
	TE_ERR_NO_DEVICE = -106,	/* no usable device for this transport */
	TE_ERR_MEMORY_TYPE = -107,	/* memory location not supported */

	TE_ERR_NOMEM = -120,	/* out of memory */
	TE_ERR_SYSTEM = -121,	/* an OS call failed (errno in the detail) */
	TE_ERR_TIMEOUT = -122,	/* deadline passed */
	TE_ERR_CANCELED = -123, /* canceled by the caller */
	TE_ERR_SHUTDOWN = -124, /* engine is shutting down */
	TE_ERR_INTERNAL = -125, /* invariant broken inside te (a bug) */
};

/*
 * te_status_str - short constant name-like text for any value, including values
 * unknown to this build ("unknown status"). Never NULL. Thread-safe.
 */
TE_API const char *te_status_str(int status);

/*
 * te_status_is_retryable - whether the core's retry policy may retry a slice that
 * ended with @status (the path/link group). Thread-safe.
 */
TE_API bool te_status_is_retryable(int status);

#ifdef __cplusplus
}
#endif

#endif /* TE_STATUS_H */
