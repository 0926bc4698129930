/* SPDX-License-Identifier: Apache-2.0 */
/* tinfo_fake.c: a do-nothing plugin with one flaw per build, for te-info's module checks. */
#include <signal.h>
#include <stdint.h>
#include <string.h>

#include <te/te_plugin.h>

/*
 * One of these per module (tinfo/meson.build):
 * TINFO_NAME                  the descriptor name (default: the module stem, TINFO_STEM)
 * TINFO_TOO_MANY_DEVICES      query_devices fills one device and reports more than max
 * TINFO_EXTRA_SYMBOL          exports tinfo_fake_extra besides the entry point
 * TINFO_CRASH_INIT / _QUERY_CAPS / _QUERY_DEVICES / _FINI   raise SIGSEGV in that op
 */
#ifndef TINFO_NAME
#define TINFO_NAME TINFO_STEM
#endif

struct tinfo_inst {
	int unused;
};

static struct tinfo_inst tinfo_the_inst;

/* A real segmentation fault is compiler-dependent to provoke; the signal is what counts. */
#define tinfo_crash() raise(SIGSEGV)

static enum te_status tinfo_init(const struct te_plugin_host *host, struct te_plugin_host_ctx *ctx,
				 struct te_plugin_inst **inst_out)
{
	(void)host;
	(void)ctx;
#ifdef TINFO_CRASH_INIT
	tinfo_crash();
#endif
	*inst_out = (struct te_plugin_inst *)&tinfo_the_inst;
	return TE_OK;
}

static void tinfo_fini(struct te_plugin_inst *inst)
{
	(void)inst;
#ifdef TINFO_CRASH_FINI
	tinfo_crash();
#endif
}

static enum te_status tinfo_query_caps(struct te_plugin_inst *inst, struct te_plugin_caps *caps)
{
	(void)inst;
#ifdef TINFO_CRASH_QUERY_CAPS
	tinfo_crash();
#endif
	caps->ops = TE_PLUGIN_CAN_READ | TE_PLUGIN_CAN_WRITE;
	caps->mem_types = TE_PLUGIN_MEM_CPU;
	caps->progress = TE_PLUGIN_PROGRESS_AUTO;
	caps->thread_level = TE_PLUGIN_THREAD_MULTI;
	caps->max_devices = 1;
	return TE_OK;
}

static enum te_status tinfo_query_devices(struct te_plugin_inst *inst,
					  struct te_plugin_device *devices, uint32_t max,
					  uint32_t *n_out)
{
	(void)inst;
#ifdef TINFO_CRASH_QUERY_DEVICES
	tinfo_crash();
#endif
	if (max < 1)
		return TE_ERR_TOO_LARGE;
	strcpy(devices[0].name, "tinfo0");
	devices[0].numa_node = -1;
	devices[0].mem_types = TE_PLUGIN_MEM_CPU;
#ifdef TINFO_TOO_MANY_DEVICES
	*n_out = max + 36; /* the bug: a count that ignores @max */
#else
	*n_out = 1;
#endif
	return TE_OK;
}

static enum te_status tinfo_reg_mem(struct te_plugin_inst *inst, void *addr, uint64_t length,
				    uint32_t mem_type, int32_t dev, uint32_t access,
				    struct te_plugin_mem **mem_out)
{
	(void)inst;
	(void)addr;
	(void)length;
	(void)mem_type;
	(void)dev;
	(void)access;
	(void)mem_out;
	return TE_ERR_UNSUPPORTED;
}

static enum te_status tinfo_dereg_mem(struct te_plugin_inst *inst, struct te_plugin_mem *mem)
{
	(void)inst;
	(void)mem;
	return TE_OK;
}

static enum te_status tinfo_pack_key(struct te_plugin_inst *inst, struct te_plugin_mem *mem,
				     void *buf, size_t cap, size_t *len_out)
{
	(void)inst;
	(void)mem;
	(void)buf;
	(void)cap;
	*len_out = 0;
	return TE_OK;
}

static enum te_status tinfo_load_peer(struct te_plugin_inst *inst, const char *peer_name,
				      const void *blob, size_t len,
				      struct te_plugin_peer **peer_out)
{
	(void)inst;
	(void)peer_name;
	(void)blob;
	(void)len;
	(void)peer_out;
	return TE_ERR_UNSUPPORTED;
}

static void tinfo_unload_peer(struct te_plugin_inst *inst, struct te_plugin_peer *peer)
{
	(void)inst;
	(void)peer;
}

static enum te_status tinfo_unpack_remote_key(struct te_plugin_inst *inst,
					      struct te_plugin_peer *peer, const void *blob,
					      size_t len, uint64_t addr, uint64_t length,
					      struct te_plugin_rkey **rkey_out)
{
	(void)inst;
	(void)peer;
	(void)blob;
	(void)len;
	(void)addr;
	(void)length;
	(void)rkey_out;
	return TE_ERR_UNSUPPORTED;
}

static enum te_status tinfo_submit(struct te_plugin_inst *inst, struct te_plugin_slice **slices,
				   uint32_t n, uint32_t *accepted_out)
{
	(void)inst;
	(void)slices;
	(void)n;
	(void)accepted_out;
	return TE_ERR_UNSUPPORTED;
}

static const struct te_plugin_ops tinfo_ops = {
	.size = sizeof(struct te_plugin_ops),
	.init = tinfo_init,
	.fini = tinfo_fini,
	.query_caps = tinfo_query_caps,
	.query_devices = tinfo_query_devices,
	.reg_mem = tinfo_reg_mem,
	.dereg_mem = tinfo_dereg_mem,
	.pack_key = tinfo_pack_key,
	.load_peer = tinfo_load_peer,
	.unload_peer = tinfo_unload_peer,
	.unpack_remote_key = tinfo_unpack_remote_key,
	.submit = tinfo_submit,
};

static const struct te_plugin_desc tinfo_desc = {
	.size = sizeof(struct te_plugin_desc),
	.abi_major = TE_PLUGIN_ABI_MAJOR,
	.abi_minor = TE_PLUGIN_ABI_MINOR,
	.name = TINFO_NAME,
	.version = "0.1",
	.description = "te-info test module",
	.ops = &tinfo_ops,
};

#ifdef TINFO_EXTRA_SYMBOL
/* The flaw: a second exported symbol (a visibility or version-script slip). */
TE_PLUGIN_EXPORT int tinfo_fake_extra(void);
TE_PLUGIN_EXPORT int tinfo_fake_extra(void)
{
	return 1;
}
#endif

TE_PLUGIN_DEFINE(&tinfo_desc)
