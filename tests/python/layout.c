/* SPDX-License-Identifier: Apache-2.0 */
/* layout.c: prints the layout of te.h's structs and constants as JSON for test_layout.py. */
#include <stddef.h>
#include <stdio.h>

#include <te/te.h>

#define FIELD(s, f)                                                                                \
	printf("%s\"%s\": [%zu, %zu]", first++ ? ", " : "", #f, offsetof(struct s, f),             \
	       sizeof(((struct s *)0)->f))
#define STRUCT_BEGIN(s)                                                                            \
	printf("%s\"%s\": {\"size\": %zu, \"fields\": {", nstruct++ ? ", " : "", #s,               \
	       sizeof(struct s)),                                                                  \
		first = 0
#define STRUCT_END() printf("}}")

int main(void)
{
	int first = 0, nstruct = 0;

	printf("{\"constants\": {\"TE_DETAIL_MAX\": %d, \"TE_NOTIFY_MAX\": %d, "
	       "\"TE_MEM_REMOTE_READ\": %u, \"TE_MEM_REMOTE_WRITE\": %u, \"TE_OP_WRITE\": %d, "
	       "\"TE_STATE_INVALID\": %d, \"TE_LOG_TRACE\": %d},\n \"structs\": {",
	       TE_DETAIL_MAX, TE_NOTIFY_MAX, TE_MEM_REMOTE_READ, TE_MEM_REMOTE_WRITE, TE_OP_WRITE,
	       TE_STATE_INVALID, TE_LOG_TRACE);

	STRUCT_BEGIN(te_engine_opts);
	FIELD(te_engine_opts, size);
	FIELD(te_engine_opts, config_path);
	FIELD(te_engine_opts, config_yaml);
	FIELD(te_engine_opts, config_yaml_len);
	FIELD(te_engine_opts, config_name);
	FIELD(te_engine_opts, log_fn);
	FIELD(te_engine_opts, log_user);
	FIELD(te_engine_opts, log_level);
	STRUCT_END();

	STRUCT_BEGIN(te_buffer_info);
	FIELD(te_buffer_info, addr);
	FIELD(te_buffer_info, length);
	FIELD(te_buffer_info, access);
	FIELD(te_buffer_info, location);
	STRUCT_END();

	STRUCT_BEGIN(te_request);
	FIELD(te_request, opcode);
	FIELD(te_request, segment);
	FIELD(te_request, local);
	FIELD(te_request, remote);
	FIELD(te_request, length);
	STRUCT_END();

	STRUCT_BEGIN(te_task_info);
	FIELD(te_task_info, state);
	FIELD(te_task_info, status);
	FIELD(te_task_info, bytes);
	FIELD(te_task_info, length);
	FIELD(te_task_info, slices);
	FIELD(te_task_info, retries);
	FIELD(te_task_info, transport);
	FIELD(te_task_info, device);
	FIELD(te_task_info, detail);
	STRUCT_END();

	STRUCT_BEGIN(te_batch_info);
	FIELD(te_batch_info, state);
	FIELD(te_batch_info, tasks);
	FIELD(te_batch_info, completed);
	FIELD(te_batch_info, failed);
	FIELD(te_batch_info, timed_out);
	FIELD(te_batch_info, canceled);
	FIELD(te_batch_info, bytes);
	STRUCT_END();

	STRUCT_BEGIN(te_notify);
	FIELD(te_notify, sender);
	FIELD(te_notify, len);
	FIELD(te_notify, msg);
	STRUCT_END();

	printf("}}\n");
	return 0;
}
