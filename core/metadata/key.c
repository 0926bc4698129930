/* SPDX-License-Identifier: Apache-2.0 */
/* key.c: where a segment's descriptor lives in a store (used by every store backend). */
#include <string.h>

#include "core/metadata/metadata.h"

char *metadata_key(const char *ns, const char *name)
{
	return g_strdup_printf("%s/segments/%s", ns, name);
}

const char *metadata_key_name(const char *ns, const char *key)
{
	size_t n = strlen(ns);

	if (strncmp(key, ns, n) != 0 || strncmp(key + n, "/segments/", 10) != 0 || !key[n + 10])
		return NULL;
	return key + n + 10;
}
