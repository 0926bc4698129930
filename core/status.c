/* SPDX-License-Identifier: Apache-2.0 */
/* status.c: names of status codes and the retryable classification. */
#include <te/te.h>

const char *te_status_str(int status)
{
	switch (status) {
	case TE_OK:
		return "ok";
	case TE_INPROGRESS:
		return "in progress";
	case TE_ERR_INVALID_ARG:
		return "invalid argument";
	case TE_ERR_INVALID_HANDLE:
		return "invalid handle";
	case TE_ERR_OVERFLOW:
		return "address range overflows";
	case TE_ERR_ADDRESS_OVERLAPPED:
		return "address overlaps a registered region";
	case TE_ERR_NOT_REGISTERED:
		return "memory not registered";
	case TE_ERR_OUT_OF_RANGE:
		return "range exceeds the registered region";
	case TE_ERR_UNKNOWN_SEGMENT:
		return "unknown segment";
	case TE_ERR_BATCH_FULL:
		return "batch full";
	case TE_ERR_BUSY:
		return "busy";
	case TE_ERR_TOO_LARGE:
		return "too large";
	case TE_ERR_EXISTS:
		return "already exists";
	case TE_ERR_NOT_FOUND:
		return "not found";
	case TE_ERR_LINK_DOWN:
		return "link down";
	case TE_ERR_CONN_RESET:
		return "connection reset";
	case TE_ERR_TRANSIENT:
		return "transient path failure";
	case TE_ERR_AGAIN:
		return "resource temporarily unavailable";
	case TE_ERR_DEVICE_FAILED:
		return "local device failed";
	case TE_ERR_PATH_TIMEOUT:
		return "path attempt timed out";
	case TE_ERR_PEER_UNREACHABLE:
		return "peer unreachable";
	case TE_ERR_REMOTE_ACCESS:
		return "remote access outside registered buffers";
	case TE_ERR_PEER_REJECTED:
		return "peer rejected the request";
	case TE_ERR_PEER_RESTARTED:
		return "peer restarted";
	case TE_ERR_PROTOCOL:
		return "protocol error";
	case TE_ERR_AUTH:
		return "authentication failed";
	case TE_ERR_NO_TRANSPORT:
		return "no transport reaches the peer";
	case TE_ERR_PEER_QUARANTINED:
		return "peer or path quarantined";
	case TE_ERR_METADATA:
		return "metadata error";
	case TE_ERR_METADATA_NOT_FOUND:
		return "metadata not found";
	case TE_ERR_METADATA_MALFORMED:
		return "malformed metadata";
	case TE_ERR_METADATA_UNAVAILABLE:
		return "metadata backend unavailable";
	case TE_ERR_UNSUPPORTED:
		return "unsupported";
	case TE_ERR_PLUGIN_NOT_FOUND:
		return "plugin not found";
	case TE_ERR_PLUGIN_INVALID:
		return "invalid plugin";
	case TE_ERR_ABI_MISMATCH:
		return "plugin ABI mismatch";
	case TE_ERR_PLUGIN_INIT:
		return "plugin init failed";
	case TE_ERR_CONFIG:
		return "configuration error";
	case TE_ERR_NO_DEVICE:
		return "no device";
	case TE_ERR_MEMORY_TYPE:
		return "memory type not supported";
	case TE_ERR_NOMEM:
		return "out of memory";
	case TE_ERR_SYSTEM:
		return "system error";
	case TE_ERR_TIMEOUT:
		return "timed out";
	case TE_ERR_CANCELED:
		return "canceled";
	case TE_ERR_SHUTDOWN:
		return "engine shutting down";
	case TE_ERR_INTERNAL:
		return "internal error";
	}
	return "unknown status";
}

bool te_status_is_retryable(int status)
{
	return status <= -40 && status >= -59;
}

const char *te_state_str(enum te_state state)
{
	switch (state) {
	case TE_STATE_WAITING:
		return "WAITING";
	case TE_STATE_PENDING:
		return "PENDING";
	case TE_STATE_COMPLETED:
		return "COMPLETED";
	case TE_STATE_FAILED:
		return "FAILED";
	case TE_STATE_TIMEOUT:
		return "TIMEOUT";
	case TE_STATE_CANCELED:
		return "CANCELED";
	case TE_STATE_INVALID:
		return "INVALID";
	}
	return "UNKNOWN";
}
