/* SPDX-License-Identifier: Apache-2.0 */
/* host.h: the host services table handed to every plugin at init. */
#ifndef TE_CORE_HOST_H
#define TE_CORE_HOST_H

#include <te/te_plugin.h>

/* Each plugin instance gets it with its transport as ctx (transport_start). */
extern const struct te_plugin_host host_services;

#endif /* TE_CORE_HOST_H */
