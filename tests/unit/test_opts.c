/* The option sets the subcommands share (apps/options.h) and the parser over
 * several sets (apps/support/opts.h): pure functions, one process. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cmocka_main.h"
#include "options.h"

/* A command as the programs compose one: shared sets beside its own. */
struct command {
	struct rmoe_preset_opts preset;
	struct rmoe_shape_opts shape;
	struct rmoe_ring_opts ring;
	int64_t seed, repeat;
	int quiet;
};

static int parse(struct command *c, int argc, char **argv, char *msg, size_t len, char *help, size_t help_len)
{
	const struct rmoe_opt shape[] = {RMOE_PRESET_OPTIONS(&c->preset), RMOE_SHAPE_OPTIONS(&c->shape)};
	const struct rmoe_opt ring[] = {RMOE_RING_OPTIONS(&c->ring)};
	const struct rmoe_opt own[] = {
		RMOE_SEED_OPTION(&c->seed),
		{"repeat", RMOE_OPT_INT, &c->repeat, 1, 1000, "R", "repetitions", NULL},
		{"quiet", RMOE_OPT_FLAG, &c->quiet, 0, 0, NULL, "say less", NULL},
	};
	const struct rmoe_opt_set sets[] = {
		RMOE_OPT_SET("shape", shape, RMOE_PRESET_NOTE),
		RMOE_OPT_SET("ring", ring, NULL),
		RMOE_OPT_SET("own", own, "  a note of the last set\n"),
	};
	if (help)
		rmoe_opts_help_sets(sets, RMOE_NELEMS(sets), help, help_len);
	return rmoe_opts_parse_sets(sets, RMOE_NELEMS(sets), argc, argv, 1, msg, len);
}

static struct command defaults(void)
{
	return (struct command){.preset.scale = 1.0, .ring = {.dtype = "f32", .ring_order = "planned"}, .seed = 1,
	                        .repeat = 3};
}

static void test_opts_sets_parse_every_set(void **state)
{
	(void)state;
	struct command c = defaults();
	char msg[256] = "";
	char *argv[] = {"x", "--hidden", "64", "--preset=MoE-E64", "--dtype", "bf16", "--repeat", "5", "--quiet",
	                "--mem-cap", "64M"};
	assert_int_equal(parse(&c, 11, argv, msg, sizeof(msg), NULL, 0), 0);
	assert_int_equal(c.shape.hidden, 64);
	assert_true(c.shape.g_hidden);
	assert_false(c.shape.g_ffn);
	assert_string_equal(c.preset.preset, "MoE-E64");
	assert_string_equal(c.ring.dtype, "bf16");
	assert_int_equal(c.ring.mem_cap, 64 << 20);
	assert_int_equal(c.repeat, 5);
	assert_int_equal(c.quiet, 1);

	/* The preset's shape, the given hidden size over it. */
	struct rmoe_layer_config cfg;
	assert_int_equal(rmoe_app_shape_config(&c.preset, &c.shape, &cfg, msg, sizeof(msg)), 0);
	assert_int_equal(cfg.hidden, 64);
	assert_int_equal(cfg.experts, 64);
	assert_int_equal(cfg.tokens, 49152);
	assert_int_equal(rmoe_app_ring_config(&c.ring, &cfg, msg, sizeof(msg)), 0);
	assert_int_equal(cfg.dtype, RMOE_DTYPE_BF16);
	assert_int_equal(cfg.mem_cap, 64 << 20);
}

static void expect_error(int argc, char **argv, const char *needle)
{
	struct command c = defaults();
	char msg[256] = "";
	assert_int_equal(parse(&c, argc, argv, msg, sizeof(msg), NULL, 0), RMOE_EINVAL);
	if (!strstr(msg, needle))
		fail_msg("message '%s' does not mention '%s'", msg, needle);
}

static void test_opts_sets_errors_name_the_value(void **state)
{
	(void)state;
	/* A typo finds the closest name in any set. */
	char *a1[] = {"x", "--reapeat", "2"};
	expect_error(3, a1, "did you mean --repeat?");
	char *a2[] = {"x", "--hiden", "2"};
	expect_error(3, a2, "did you mean --hidden?");
	/* The shared limits. */
	char *a3[] = {"x", "--hidden", "1000000001"};
	expect_error(3, a3, "--hidden '1000000001': expected an integer from 1 to 1000000000");
	char *a4[] = {"x", "--experts", "0"};
	expect_error(3, a4, "--experts '0': expected an integer from 1 to 1000000");
	char *a5[] = {"x", "--tokens", "2e12"};
	expect_error(3, a5, "--tokens '2e12'");

	struct command c = defaults();
	struct rmoe_layer_config cfg;
	char msg[256] = "";
	c.preset.scale = 4;
	assert_int_equal(rmoe_app_shape_config(&c.preset, &c.shape, &cfg, msg, sizeof(msg)), RMOE_EINVAL);
	assert_non_null(strstr(msg, "--scale 4 needs --preset"));
	c.ring.dtype = "f16";
	assert_int_equal(rmoe_app_ring_config(&c.ring, &cfg, msg, sizeof(msg)), RMOE_EINVAL);
	assert_non_null(strstr(msg, "--dtype 'f16': expected f32 or bf16"));
	c.ring.dtype = "f32";
	c.ring.ring_order = "random";
	assert_int_equal(rmoe_app_ring_config(&c.ring, &cfg, msg, sizeof(msg)), RMOE_EINVAL);
	assert_non_null(strstr(msg, "--ring-order 'random'"));
}

static void test_opts_sets_refuse_a_name_twice(void **state)
{
	(void)state;
	int64_t a = 0, b = 0;
	const struct rmoe_opt first[] = {{"seed", RMOE_OPT_INT, &a, 0, 10, "N", "one", NULL}};
	const struct rmoe_opt second[] = {{"other", RMOE_OPT_INT, &b, 0, 10, "N", "two", NULL},
	                                  {"seed", RMOE_OPT_INT, &b, 0, 10, "N", "three", NULL}};
	const struct rmoe_opt_set sets[] = {RMOE_OPT_SET(NULL, first, NULL), RMOE_OPT_SET(NULL, second, NULL)};
	char msg[128] = "";
	char *argv[] = {"x", "--other", "1"};
	assert_int_equal(rmoe_opts_parse_sets(sets, 2, 3, argv, 1, msg, sizeof(msg)), RMOE_EINVAL);
	assert_non_null(strstr(msg, "--seed is defined twice"));
	/* Twice within one set too. */
	const struct rmoe_opt both[] = {{"seed", RMOE_OPT_INT, &a, 0, 10, "N", "one", NULL},
	                                {"seed", RMOE_OPT_INT, &b, 0, 10, "N", "two", NULL}};
	assert_int_equal(rmoe_opts_parse(both, RMOE_NELEMS(both), 1, argv, 1, msg, sizeof(msg)), RMOE_EINVAL);
}

static void test_opts_sets_help_lists_sets_and_defaults(void **state)
{
	(void)state;
	struct command c = defaults();
	char msg[256] = "", help[8192];
	char *argv[] = {"x", "--help"};
	assert_int_equal(parse(&c, 2, argv, msg, sizeof(msg), help, sizeof(help)), 1);
	const char *want[] = {"shape:\n", "\nring:\n", "\nown:\n", "--preset takes a Table 3 shape",
	                      "a note of the last set\n", "--seed N", "(default 1)\n", "(default 3)\n",
	                      "(default f32)\n", "(default planned)\n"};
	for (size_t i = 0; i < RMOE_NELEMS(want); i++)
		if (!strstr(help, want[i]))
			fail_msg("--help does not show '%s':\n%s", want[i], help);
	/* Zero values and flags show no default. */
	assert_null(strstr(help, "(default 0)"));
	const char *hidden = strstr(help, "--hidden H");
	assert_non_null(hidden);
	const char *end = strchr(hidden, '\n'), *shown = strstr(hidden, "(default");
	assert_true(!shown || shown > end);
	/* Cut short, never overrun, in a small buffer. */
	char small[40];
	memset(small, 'x', sizeof(small));
	parse(&c, 2, argv, msg, sizeof(msg), small, sizeof(small) - 8);
	assert_true(strlen(small) < sizeof(small) - 8);
	assert_int_equal(small[sizeof(small) - 1], 'x');
}

RMOE_TEST_MAIN(NULL, NULL,
               cmocka_unit_test(test_opts_sets_parse_every_set),
               cmocka_unit_test(test_opts_sets_errors_name_the_value),
               cmocka_unit_test(test_opts_sets_refuse_a_name_twice),
               cmocka_unit_test(test_opts_sets_help_lists_sets_and_defaults))
