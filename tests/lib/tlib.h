/* SPDX-License-Identifier: Apache-2.0 */
/* tlib.h: what every test of tests/ shares: status assertions, time units, sleeping. */
#ifndef TE_TESTS_LIB_TLIB_H
#define TE_TESTS_LIB_TLIB_H

#include <stdint.h>
#include <string.h>

#include <glib.h>

#include <te/te.h>

#define MS_NS (1000ll * 1000)
#define S_NS (1000ll * MS_NS)

/* Assert that a te_* call returned @expected; on mismatch print te_last_error(). */
#define assert_status(call, expected)                                                              \
	do {                                                                                       \
		enum te_status st_ = (call);                                                       \
		enum te_status ex_ = (expected);                                                   \
		if (st_ != ex_)                                                                    \
			g_error("%s:%d: %s returned %d (%s), expected %d (%s); last error: %s",    \
				__FILE__, __LINE__, #call, st_, te_status_str(st_), ex_,           \
				te_status_str(ex_), te_last_error());                              \
	} while (0)

#define assert_ok(call) assert_status(call, TE_OK)

/* Assert @haystack contains @needle, printing both when it does not. */
#define assert_contains(haystack, needle)                                                          \
	do {                                                                                       \
		const char *h_ = (haystack);                                                       \
		const char *n_ = (needle);                                                         \
		if (!h_ || !strstr(h_, n_))                                                        \
			g_error("%s:%d: \"%s\" does not contain \"%s\"", __FILE__, __LINE__,       \
				h_ ? h_ : "(null)", n_);                                           \
	} while (0)

/* Monotonic clock in nanoseconds. */
int64_t now_ns(void);
/* Sleep @ms milliseconds (not used as a threshold: only to let late events happen). */
void sleep_ms(unsigned ms);

#endif /* TE_TESTS_LIB_TLIB_H */
