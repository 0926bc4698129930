/* SPDX-License-Identifier: Apache-2.0 */
/* plugin_options_test.c: declared plugin options (ABI 1.2): declarations, YAML checks, defaults. */
#include <string.h>

#include <glib.h>

#include "core/config.h"
#include "core/plugin.h"

static const char *const modes[] = { "auto", "manual", NULL };

static const struct te_plugin_option decls[] = {
	TE_PLUGIN_OPTION_BOOL("verbose", "no", "a boolean"),
	TE_PLUGIN_OPTION_INT("lanes", "2", 1, 16, "an integer"),
	TE_PLUGIN_OPTION_INT("bias", "-1", -100, 100, "a signed integer"),
	TE_PLUGIN_OPTION_INT("any", NULL, 0, 0, "an integer without range or default"),
	TE_PLUGIN_OPTION_SIZE("slice_size", "64K", 4096, 1 << 30, "a size"),
	TE_PLUGIN_OPTION_STRING("label", "lo", "a string"),
	TE_PLUGIN_OPTION_CHOICE("progress", "auto", modes, "a choice"),
	TE_PLUGIN_OPTION(TE_PLUGIN_OPT_STRING, "device", NULL, 0, 0, NULL, TE_PLUGIN_OPT_REQUIRED,
			 "the device"),
};

/* Parse @yaml (file name "t.yaml") and apply decls to transports[0]. */
static enum te_status apply(const char *yaml, struct config **cfg_out, char **err_out)
{
	struct config *cfg = NULL;
	g_autofree char *err = NULL;
	enum te_status st = config_parse(yaml, strlen(yaml), "t.yaml", &cfg, &err);

	if (st != TE_OK)
		g_error("config_parse: %s", err);
	st = config_apply_options(cfg, 0, "fake", decls, G_N_ELEMENTS(decls), err_out);
	*cfg_out = cfg;
	return st;
}

static void expect_option_error(const char *options, const char *want)
{
	g_autofree char *yaml =
		g_strdup_printf("transports:\n  - name: fake\n    options:\n%s", options);
	g_autofree char *err = NULL;
	struct config *cfg = NULL;

	g_assert_cmpint(apply(yaml, &cfg, &err), ==, TE_ERR_CONFIG);
	g_assert_cmpstr(err, ==, want);
	/* The transport keeps what the YAML said: a failed check changes nothing. */
	g_assert_cmpuint(cfg->transports[0].n_options, >=, 1);
	config_free(cfg);
}

static void test_normalize(void)
{
	static const struct {
		int decl; /* index in decls */
		const char *text, *normal;
	} ok[] = {
		{ 0, "YES", "true" },
		{ 0, "off", "false" },
		{ 0, "On", "true" },
		{ 1, "16", "16" },
		{ 1, "+3", "3" },
		{ 2, "-100", "-100" },
		{ 2, "-0", "0" },
		{ 3, "-9223372036854775808", "-9223372036854775808" },
		{ 3, "9223372036854775807", "9223372036854775807" },
		{ 4, "4096", "4096" },
		{ 4, "64K", "65536" },
		{ 4, "1 GiB", "1073741824" },
		{ 4, "2m", "2097152" },
		{ 5, "", "" },
		{ 5, " a b ", " a b " },
		{ 6, "manual", "manual" },
	};
	static const struct {
		int decl;
		const char *text, *reason;
	} bad[] = {
		{ 0, "1", "expected a boolean (true, false, yes, no, on, off), got \"1\"" },
		{ 0, "", "expected a boolean (true, false, yes, no, on, off), got \"\"" },
		{ 1, "0", "value 0 out of range 1..16" },
		{ 1, "17", "value 17 out of range 1..16" },
		{ 1, "2.5", "expected an integer, got \"2.5\"" },
		{ 1, "0x10", "expected an integer, got \"0x10\"" },
		{ 2, "-101", "value -101 out of range -100..100" },
		{ 3, "9223372036854775808",
		  "value 9223372036854775808 out of range -9223372036854775808..9223372036854775807" },
		{ 4, "1K", "value 1K out of range 4K..1G" },
		{ 4, "2G", "value 2G out of range 4K..1G" },
		{ 4, "-4K", "value -4K out of range 4K..1G" },
		{ 4, "lots", "expected a size (e.g. 4096, 64K, 1M, 1G, 64KiB), got \"lots\"" },
		{ 6, "Auto", "expected one of: auto, manual, got \"Auto\"" },
	};

	for (size_t i = 0; i < G_N_ELEMENTS(ok); i++) {
		g_autofree char *normal = NULL;
		g_autofree char *reason = NULL;

		g_assert_cmpint(
			config_option_normalize(&decls[ok[i].decl], ok[i].text, &normal, &reason),
			==, TE_OK);
		g_assert_cmpstr(normal, ==, ok[i].normal);
	}
	for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
		g_autofree char *normal = NULL;
		g_autofree char *reason = NULL;

		g_assert_cmpint(
			config_option_normalize(&decls[bad[i].decl], bad[i].text, &normal, &reason),
			==, TE_ERR_CONFIG);
		g_assert_null(normal);
		g_assert_cmpstr(reason, ==, bad[i].reason);
	}
}

static void test_effective(void)
{
	static const char *const want[][2] = {
		{ "verbose", "true" },	     { "lanes", "2" },	{ "bias", "-1" },
		{ "slice_size", "1048576" }, { "label", "lo" }, { "progress", "auto" },
		{ "device", "/dev/dax0.0" },
	};
	const char *yaml = "transports:\n"
			   "  - name: fake\n"
			   "    options:\n"
			   "      device: /dev/dax0.0\n"
			   "      slice_size: 1M\n"
			   "      label: ~\n"
			   "      verbose: on\n";
	g_autofree char *err = NULL;
	g_autofree char *text = NULL;
	struct config *cfg = NULL;
	struct config *again = NULL;
	const struct config_transport *t;

	g_assert_cmpint(apply(yaml, &cfg, &err), ==, TE_OK);
	t = &cfg->transports[0];
	/* Declaration order; the YAML's values normalized, defaults filled in, null = default. */
	g_assert_cmpuint(t->n_options, ==, G_N_ELEMENTS(want));
	for (size_t i = 0; i < G_N_ELEMENTS(want); i++) {
		g_assert_cmpstr(t->options[i].key, ==, want[i][0]);
		g_assert_cmpstr(t->options[i].value, ==, want[i][1]);
	}
	g_assert_null(config_transport_option(t, "any"));
	/* The effective configuration reads back and checks again to the same options. */
	text = config_to_yaml(cfg);
	g_assert_cmpint(config_parse(text, strlen(text), "again", &again, &err), ==, TE_OK);
	g_assert_cmpint(config_apply_options(again, 0, "fake", decls, G_N_ELEMENTS(decls), &err),
			==, TE_OK);
	g_assert_cmpuint(again->transports[0].n_options, ==, t->n_options);
	for (size_t i = 0; i < t->n_options; i++)
		g_assert_cmpstr(again->transports[0].options[i].value, ==, t->options[i].value);
	config_free(again);
	config_free(cfg);
}

static void test_errors(void)
{
	/* Unknown: a close name is suggested (any case), otherwise every name is listed. */
	expect_option_error("      device: d\n      lanez: 4\n",
			    "t.yaml:5:7: transports[0].options.lanez: unknown option of plugin "
			    "fake (did you mean \"lanes\"?)");
	expect_option_error("      device: d\n      lable: x\n",
			    "t.yaml:5:7: transports[0].options.lable: unknown option of plugin "
			    "fake (did you mean \"label\"?)");
	expect_option_error("      Lanes: 4\n",
			    "t.yaml:4:7: transports[0].options.Lanes: unknown option of plugin "
			    "fake (did you mean \"lanes\"?)");
	expect_option_error("      colour: blue\n",
			    "t.yaml:4:7: transports[0].options.colour: unknown option of plugin "
			    "fake (expected one of: verbose, lanes, bias, any, slice_size, label, "
			    "progress, device)");
	expect_option_error("      \"a.b\": 1\n",
			    "t.yaml:4:7: transports[0].options.\"a.b\": unknown option of plugin "
			    "fake (expected one of: verbose, lanes, bias, any, slice_size, label, "
			    "progress, device)");
	/* Values: at the value's position. */
	expect_option_error("      device: d\n      lanes: 0\n",
			    "t.yaml:5:14: transports[0].options.lanes: value 0 out of range 1..16");
	expect_option_error("      device: d\n      verbose: 1\n",
			    "t.yaml:5:16: transports[0].options.verbose: expected a boolean (true, "
			    "false, yes, no, on, off), got \"1\"");
	expect_option_error("      device: d\n      slice_size: 12q\n",
			    "t.yaml:5:19: transports[0].options.slice_size: expected a size (e.g. "
			    "4096, 64K, 1M, 1G, 64KiB), got \"12q\"");
	expect_option_error("      device: d\n      progress: sometimes\n",
			    "t.yaml:5:17: transports[0].options.progress: expected one of: auto, "
			    "manual, got \"sometimes\"");
	/* A required option that is missing (or null): at the options mapping. */
	expect_option_error("      lanes: 3\n",
			    "t.yaml:4:7: transports[0].options.device: missing required option of "
			    "plugin fake (the device)");
	expect_option_error("      device: ~\n",
			    "t.yaml:4:7: transports[0].options.device: missing required option of "
			    "plugin fake (the device)");
}

static void test_required_without_options(void)
{
	const char *yaml = "transports:\n  - name: tcp\n  - name: fake\n    required: false\n";
	g_autofree char *err = NULL;
	struct config *cfg = NULL;

	g_assert_cmpint(config_parse(yaml, strlen(yaml), "t.yaml", &cfg, &err), ==, TE_OK);
	g_assert_cmpint(config_apply_options(cfg, 1, "fake", decls, G_N_ELEMENTS(decls), &err), ==,
			TE_ERR_CONFIG);
	/* No options: mapping: at the transport's mapping. */
	g_assert_cmpstr(err, ==,
			"t.yaml:3:5: transports[1].options.device: missing required option of "
			"plugin fake (the device)");
	config_free(cfg);
}

static void test_undeclared_untouched(void)
{
	const char *yaml = "transports:\n  - name: x\n    options:\n      anything: ~\n";
	g_autofree char *err = NULL;
	struct config *cfg = NULL;

	g_assert_cmpint(config_parse(yaml, strlen(yaml), "t.yaml", &cfg, &err), ==, TE_OK);
	g_assert_cmpint(config_apply_options(cfg, 0, "x", NULL, 0, &err), ==, TE_OK);
	g_assert_cmpuint(cfg->transports[0].n_options, ==, 1);
	g_assert_cmpstr(cfg->transports[0].options[0].value, ==, "");
	g_assert_cmpint(config_apply_options(cfg, 3, "x", NULL, 0, &err), ==, TE_ERR_INVALID_ARG);
	config_free(cfg);
}

/* --- declarations ------------------------------------------------------------------------- */

static struct te_plugin_ops ops = { .size = sizeof(ops) };

static struct te_plugin_desc desc_with(const struct te_plugin_option *opts, uint32_t n)
{
	struct te_plugin_desc d = {
		.size = sizeof(d),
		.abi_major = TE_PLUGIN_ABI_MAJOR,
		.abi_minor = TE_PLUGIN_ABI_MINOR,
		.name = "fake",
		.ops = &ops,
		.options = opts,
		.n_options = n,
		.option_size = sizeof(struct te_plugin_option),
	};
	return d;
}

static void expect_decl_error(const struct te_plugin_option *opts, uint32_t n, const char *want)
{
	struct te_plugin_desc d = desc_with(opts, n);
	struct te_plugin_option *out = (struct te_plugin_option *)&d;
	uint32_t n_out = 99;
	g_autofree char *err = NULL;

	g_assert_cmpint(plugin_validate_options(&d, "/p/fake.so", &out, &n_out, &err), ==,
			TE_ERR_PLUGIN_INVALID);
	g_assert_null(out);
	g_assert_cmpuint(n_out, ==, 0);
	g_assert_cmpstr(err, ==, want);
}

static void test_declarations_good(void)
{
	struct te_plugin_desc d = desc_with(decls, G_N_ELEMENTS(decls));
	struct te_plugin_option *out = NULL;
	uint32_t n = 0;
	g_autofree char *err = NULL;

	g_assert_cmpint(plugin_validate_options(&d, "f", &out, &n, &err), ==, TE_OK);
	g_assert_cmpuint(n, ==, G_N_ELEMENTS(decls));
	g_assert_cmpstr(out[4].name, ==, "slice_size");
	g_assert_cmpint(out[4].max, ==, 1 << 30);
	g_free(out);

	/* Nothing declared, or a descriptor of 1.1: free-form. */
	d = desc_with(NULL, 0);
	g_assert_cmpint(plugin_validate_options(&d, "f", &out, &n, &err), ==, TE_OK);
	g_assert_null(out);
	g_assert_cmpuint(n, ==, 0);
	d = desc_with(decls, G_N_ELEMENTS(decls));
	d.abi_minor = 1;
	g_assert_cmpint(plugin_validate_options(&d, "f", &out, &n, &err), ==, TE_OK);
	g_assert_null(out);
	d = desc_with(decls, G_N_ELEMENTS(decls));
	d.size = offsetof(struct te_plugin_desc, options);
	g_assert_cmpint(plugin_validate_options(&d, "f", &out, &n, &err), ==, TE_OK);
	g_assert_null(out);
}

static void test_declarations_bad(void)
{
	static const char *const none[] = { NULL };
	static const char *const empty_choice[] = { "a", "", NULL };
	const struct te_plugin_option dup[] = {
		TE_PLUGIN_OPTION_BOOL("x", NULL, NULL),
		TE_PLUGIN_OPTION_INT("x", NULL, 0, 1, NULL),
	};
	const struct te_plugin_option no_name[] = { TE_PLUGIN_OPTION_BOOL(NULL, NULL, NULL) };
	const struct te_plugin_option bad_name[] = { TE_PLUGIN_OPTION_BOOL("Bad Name", NULL,
									   NULL) };
	const struct te_plugin_option bad_type[] = {
		TE_PLUGIN_OPTION(9, "t", NULL, 0, 0, NULL, 0, NULL),
	};
	const struct te_plugin_option bad_default[] = {
		TE_PLUGIN_OPTION_INT("lanes", "many", 1, 4, NULL),
	};
	const struct te_plugin_option out_of_range_default[] = {
		TE_PLUGIN_OPTION_INT("lanes", "0", 1, 4, NULL),
	};
	const struct te_plugin_option bad_choice_default[] = {
		TE_PLUGIN_OPTION_CHOICE("mode", "off", modes, NULL),
	};
	const struct te_plugin_option min_max[] = { TE_PLUGIN_OPTION_INT("r", NULL, 5, 4, NULL) };
	const struct te_plugin_option neg_size[] = { TE_PLUGIN_OPTION_SIZE("s", NULL, -1, 4,
									   NULL) };
	const struct te_plugin_option no_choices[] = {
		TE_PLUGIN_OPTION_CHOICE("c", NULL, NULL, NULL),
		TE_PLUGIN_OPTION_CHOICE("d", NULL, none, NULL),
	};
	const struct te_plugin_option bad_choices[] = {
		TE_PLUGIN_OPTION_CHOICE("c", NULL, empty_choice, NULL),
	};
	const struct te_plugin_option stray_choices[] = {
		TE_PLUGIN_OPTION(TE_PLUGIN_OPT_STRING, "s", NULL, 0, 0, modes, 0, NULL),
	};
	const struct te_plugin_option required_default[] = {
		TE_PLUGIN_OPTION(TE_PLUGIN_OPT_STRING, "s", "x", 0, 0, NULL, TE_PLUGIN_OPT_REQUIRED,
				 NULL),
	};
	const struct te_plugin_option bad_flags[] = {
		TE_PLUGIN_OPTION(TE_PLUGIN_OPT_STRING, "s", NULL, 0, 0, NULL, 0x80, NULL),
	};
	struct te_plugin_option bad_size[] = { TE_PLUGIN_OPTION_BOOL("b", NULL, NULL) };
	struct te_plugin_desc d;
	struct te_plugin_option *out;
	uint32_t n;
	g_autofree char *err = NULL;

	expect_decl_error(dup, 2, "/p/fake.so: option 'x' is declared twice (options 0 and 1)");
	expect_decl_error(no_name, 1, "/p/fake.so: option 0 has no name");
	expect_decl_error(bad_name, 1,
			  "/p/fake.so: option 0: invalid name \"Bad Name\" (expected "
			  "[a-z][a-z0-9_-]*, at most 63 bytes)");
	expect_decl_error(bad_type, 1, "/p/fake.so: option 't': unknown type 9");
	expect_decl_error(bad_default, 1,
			  "/p/fake.so: option 'lanes': default \"many\" is invalid: expected an "
			  "integer, got \"many\"");
	expect_decl_error(out_of_range_default, 1,
			  "/p/fake.so: option 'lanes': default \"0\" is invalid: value 0 out of "
			  "range 1..4");
	expect_decl_error(bad_choice_default, 1,
			  "/p/fake.so: option 'mode': default \"off\" is invalid: expected one of: "
			  "auto, manual, got \"off\"");
	expect_decl_error(min_max, 1, "/p/fake.so: option 'r': min 5 is above max 4");
	expect_decl_error(neg_size, 1,
			  "/p/fake.so: option 's': a SIZE range cannot be negative (min -1)");
	expect_decl_error(no_choices, 1,
			  "/p/fake.so: option 'c': a CHOICE needs 1..64 choices (a NULL-terminated "
			  "array)");
	expect_decl_error(no_choices + 1, 1,
			  "/p/fake.so: option 'd': a CHOICE needs 1..64 choices (a NULL-terminated "
			  "array)");
	expect_decl_error(bad_choices, 1, "/p/fake.so: option 'c': choice 1 is empty");
	expect_decl_error(stray_choices, 1,
			  "/p/fake.so: option 's': choices given for a type other than CHOICE");
	expect_decl_error(required_default, 1,
			  "/p/fake.so: option 's': a required option cannot have a default");
	expect_decl_error(bad_flags, 1, "/p/fake.so: option 's': unknown flags 0x80");
	bad_size[0].size = 8;
	expect_decl_error(bad_size, 1,
			  "/p/fake.so: option 0: size 8 differs from the descriptor's option_size "
			  "64");
	expect_decl_error(NULL, 2, "/p/fake.so: descriptor declares 2 options but options is NULL");
	expect_decl_error(decls, TE_PLUGIN_MAX_OPTIONS + 1,
			  "/p/fake.so: descriptor declares 65 options, more than 64");

	d = desc_with(decls, 1);
	d.option_size = 8;
	g_assert_cmpint(plugin_validate_options(&d, "f", &out, &n, &err), ==,
			TE_ERR_PLUGIN_INVALID);
	g_assert_cmpstr(err, ==, "f: option_size 8 is smaller than ABI 1.2's 64");
}

int main(int argc, char **argv)
{
	g_test_init(&argc, &argv, NULL);
	g_test_add_func("/plugin-options/normalize", test_normalize);
	g_test_add_func("/plugin-options/effective", test_effective);
	g_test_add_func("/plugin-options/errors", test_errors);
	g_test_add_func("/plugin-options/required-without-options", test_required_without_options);
	g_test_add_func("/plugin-options/undeclared-untouched", test_undeclared_untouched);
	g_test_add_func("/plugin-options/declarations-good", test_declarations_good);
	g_test_add_func("/plugin-options/declarations-bad", test_declarations_bad);
	return g_test_run();
}
