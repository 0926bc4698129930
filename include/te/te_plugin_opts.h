/* SPDX-License-Identifier: Apache-2.0 */
/*
 * te_plugin_opts.h: a plugin's YAML options (host->config_get strings), header-only.
 *
 * A plugin cannot link libte, so these are static inline functions with libc only.
 *
 * Plugins that declare their options (te_plugin.h, "Declared options", ABI 1.2) get values the
 * core checked and normalized, defaults filled in: te_plugin_opt_bool, _int, _size and _choice
 * below only convert them.
 *
 * Plugins that declare nothing parse the text themselves and report errors their own way
 * (host->set_error), naming the option:
 *
 *   const char *s = host->config_get(ctx, "window");
 *   uint64_t window = 128;
 *   if (s && !te_plugin_parse_u64(s, false, 1, 4096, &window))
 *           ... "option 'window': expected an integer in [1, 4096], got '%s'" ...
 */
#ifndef TE_PLUGIN_OPTS_H
#define TE_PLUGIN_OPTS_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <te/te_plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Elements of a fixed array (the list of option names). */
#define TE_PLUGIN_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* What te_plugin_parse_u64's @size_suffix accepts, for error messages. */
#define TE_PLUGIN_SIZE_SUFFIXES "K/M/G/T"

/*
 * Decimal integer in [@min, @max] into *@out (untouched on failure). With @size_suffix an
 * optional binary suffix follows: K, M, G or T, then optionally "i" and "B" (any case: 4k,
 * 4KiB, 1MB = 2^20). No sign, no spaces, no hex, no overflow. true when valid.
 */
static inline bool te_plugin_parse_u64(const char *s, bool size_suffix, uint64_t min, uint64_t max,
				       uint64_t *out)
{
	unsigned long long v;
	uint64_t mult = 1;
	char *end;

	if (!s || *s < '0' || *s > '9')
		return false;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (end == s || errno != 0)
		return false;
	if (size_suffix && *end) {
		/* K, M, G, T (either case): powers of 1024 */
		static const char units[] = "KMGT";
		char c = (*end >= 'a' && *end <= 'z') ? (char)(*end - 'a' + 'A') : *end;
		const char *unit = strchr(units, c);

		if (!unit)
			return false;
		mult = 1ull << (10 * (unit - units + 1));
		end++;
		if (*end == 'i' || *end == 'I')
			end++;
		if (*end == 'b' || *end == 'B')
			end++;
	}
	if (*end != '\0' || (v != 0 && mult > UINT64_MAX / v))
		return false;
	v *= mult;
	if (v < min || v > max)
		return false;
	*out = (uint64_t)v;
	return true;
}

/* The words te_plugin_parse_bool accepts, for messages. */
#define TE_PLUGIN_BOOL_WORDS "true, false, yes, no, on, off"

/* ASCII-only case-insensitive equality (no locale: "I" is "i" everywhere). */
static inline bool te_plugin_ascii_caseeq_(const char *a, const char *b)
{
	for (;; a++, b++) {
		char x = (*a >= 'A' && *a <= 'Z') ? (char)(*a - 'A' + 'a') : *a;
		char y = (*b >= 'A' && *b <= 'Z') ? (char)(*b - 'A' + 'a') : *b;

		if (x != y)
			return false;
		if (!x)
			return true;
	}
}

/*
 * true, yes, on / false, no, off (any case; nothing else, not 1 or 0) into *@out. true when
 * valid. The one boolean rule of te: the core reads its own keys (transfer.fallback,
 * transports[].required) and declared BOOL options with this function.
 */
static inline bool te_plugin_parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = { "true", "yes", "on" };
	static const char *const no[] = { "false", "no", "off" };

	for (size_t i = 0; s && i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (te_plugin_ascii_caseeq_(s, yes[i])) {
			*out = true;
			return true;
		}
		if (te_plugin_ascii_caseeq_(s, no[i])) {
			*out = false;
			return true;
		}
	}
	return false;
}

/* Index of @s in the NULL-terminated @choices (exact match), or -1. */
static inline int te_plugin_parse_enum(const char *s, const char *const *choices)
{
	for (int i = 0; s && choices[i]; i++)
		if (strcmp(s, choices[i]) == 0)
			return i;
	return -1;
}

/* "a, b, c" from @n @names into @buf (cut short, never overflowing); returns @buf. */
static inline char *te_plugin_join(const char *const *names, size_t n, char *buf, size_t len)
{
	size_t at = 0;

	if (!len)
		return buf;
	buf[0] = '\0';
	for (size_t i = 0; i < n && at + 1 < len; i++) {
		int k = snprintf(buf + at, len - at, "%s%s", i ? ", " : "", names[i]);

		if (k < 0)
			break;
		at += (size_t)k < len - at ? (size_t)k : len - at - 1;
	}
	return buf;
}

struct te_plugin_unknown_ {
	const char *const *names;
	size_t n;
	char *bad;
	size_t bad_len;
	bool found;
};

static inline void te_plugin_unknown_cb_(void *user, const char *key, const char *value)
{
	struct te_plugin_unknown_ *u = (struct te_plugin_unknown_ *)user;

	(void)value;
	if (u->found)
		return;
	for (size_t i = 0; i < u->n; i++)
		if (strcmp(key, u->names[i]) == 0)
			return;
	u->found = true;
	snprintf(u->bad, u->bad_len, "%s", key);
}

/*
 * The first option of this instance's YAML that is not one of the @n @names: copied into
 * @bad (@bad_len bytes) and true; false when every option is known.
 */
static inline bool te_plugin_unknown_option(const struct te_plugin_host *host,
					    struct te_plugin_host_ctx *ctx,
					    const char *const *names, size_t n, char *bad,
					    size_t bad_len)
{
	struct te_plugin_unknown_ u = { names, n, bad, bad_len, false };

	if (bad_len)
		bad[0] = '\0';
	if (host && host->config_foreach)
		host->config_foreach(ctx, te_plugin_unknown_cb_, &u);
	return u.found;
}

/*
 * --- declared options (ABI 1.2) ---
 * Readers of options the plugin declared: the core hands them in normal form (te_plugin.h), so
 * these only convert. @fallback is returned when config_get gives NULL (an option without a
 * default that the YAML does not set) or, defensively, text not in normal form.
 */

static inline bool te_plugin_opt_bool(const struct te_plugin_host *host,
				      struct te_plugin_host_ctx *ctx, const char *name,
				      bool fallback)
{
	const char *s = host->config_get(ctx, name);
	bool v;

	return s && te_plugin_parse_bool(s, &v) ? v : fallback;
}

static inline int64_t te_plugin_opt_int(const struct te_plugin_host *host,
					struct te_plugin_host_ctx *ctx, const char *name,
					int64_t fallback)
{
	const char *s = host->config_get(ctx, name);
	long long v;
	char *end;

	if (!s || !*s)
		return fallback;
	errno = 0;
	v = strtoll(s, &end, 10);
	return *end || errno ? fallback : (int64_t)v;
}

static inline uint64_t te_plugin_opt_size(const struct te_plugin_host *host,
					  struct te_plugin_host_ctx *ctx, const char *name,
					  uint64_t fallback)
{
	const char *s = host->config_get(ctx, name);
	uint64_t v;

	return s && te_plugin_parse_u64(s, false, 0, UINT64_MAX, &v) ? v : fallback;
}

/* Index of the value in the NULL-terminated @choices (the declaration's), or @fallback. */
static inline int te_plugin_opt_choice(const struct te_plugin_host *host,
				       struct te_plugin_host_ctx *ctx, const char *name,
				       const char *const *choices, int fallback)
{
	int i = te_plugin_parse_enum(host->config_get(ctx, name), choices);

	return i >= 0 ? i : fallback;
}

#ifdef __cplusplus
}
#endif

#endif /* TE_PLUGIN_OPTS_H */
