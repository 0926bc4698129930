/* SPDX-License-Identifier: Apache-2.0 */
/* no_entry.c: a valid shared object that exports no plugin entry point, for loader tests. */

#include <te/te_plugin.h>

/* Something other than TE_PLUGIN_ENTRY, so the module loads but is not a plugin. */
TE_PLUGIN_EXPORT int no_entry_hello(void);
TE_PLUGIN_EXPORT int no_entry_hello(void)
{
	return 42;
}
