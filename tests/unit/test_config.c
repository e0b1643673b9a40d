/* Configuration checks, presets and the option parser: pure functions. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cmocka_main.h"
#include "opts.h"
#include "rmoe_scheduler.h"

static struct rmoe_layer_config good(void)
{
	struct rmoe_layer_config c;
	rmoe_layer_config_init(&c);
	return c;
}

static void expect_invalid(struct rmoe_layer_config c, int nranks, const char *needle)
{
	int rc = rmoe_config_check(&c, nranks);
	assert_int_not_equal(rc, 0);
	const char *msg = rmoe_strerror(rc);
	if (!strstr(msg, needle))
		fail_msg("message '%s' does not mention '%s'", msg, needle);
}

static void test_config_defaults_pass(void **state)
{
	(void)state;
	struct rmoe_layer_config c = good();
	for (int n = 1; n <= 8; n *= 2)
		assert_int_equal(rmoe_config_check(&c, n), 0);
}

static void test_config_rejects_bad_values(void **state)
{
	(void)state;
	struct rmoe_layer_config c;
	c = good(); c.hidden = 0; expect_invalid(c, 1, "hidden = 0");
	c = good(); c.ffn = -3; expect_invalid(c, 1, "ffn = -3");
	c = good(); c.experts = 0; expect_invalid(c, 1, "experts = 0");
	c = good(); c.tokens = -1; expect_invalid(c, 1, "tokens = -1");
	c = good(); c.topk = 200; expect_invalid(c, 1, "topk = 200");
	c = good(); c.experts = 10; expect_invalid(c, 4, "not divisible by the 4 ranks");
	c = good(); c.shared_ffn = -1; expect_invalid(c, 1, "shared_ffn");
	c = good(); c.shared_gated = 1; expect_invalid(c, 1, "shared_gated = 1 but shared_ffn = 0");
	c = good(); c.shared_ffn = 8; c.shared_gated = 2; expect_invalid(c, 1, "shared_gated = 2");
	c = good(); c.chunk_rows = -5; expect_invalid(c, 1, "chunk_rows");
	c = good(); c.window = 1; expect_invalid(c, 4, "window = 1");
	c = good(); c.window = -2; expect_invalid(c, 4, "window = -2");
	c = good(); c.norm_topk = 2; expect_invalid(c, 1, "norm_topk");
	c = good(); c.dispatch = (enum rmoe_dispatch)42; expect_invalid(c, 1, "dispatch");
	c = good(); c.tokens = INT64_MAX / 2; expect_invalid(c, 1, "tokens x topk");
	c = good(); c.tokens = 40000000; expect_invalid(c, 1, "tokens x hidden");
	c = good(); c.hidden = INT64_MAX / 4; expect_invalid(c, 1, "hidden");
	c = good(); c.dtype = (enum rmoe_dtype)7; expect_invalid(c, 1, "dtype = 7");
	/* bf16 runs on every build (CPU kernels compute in fp32 copies). */
	c = good(); c.dtype = RMOE_DTYPE_BF16;
	assert_int_equal(rmoe_config_check(&c, 1), 0);
}

static void test_config_hash_tracks_fields(void **state)
{
	(void)state;
	struct rmoe_layer_config a = good(), b = good();
	assert_true(rmoe_config_hash(&a) == rmoe_config_hash(&b));
	b.tokens++;
	assert_true(rmoe_config_hash(&a) != rmoe_config_hash(&b));
	b = good();
	b.dispatch = RMOE_DISPATCH_ALLTOALL;
	assert_true(rmoe_config_hash(&a) != rmoe_config_hash(&b));
	/* a gated and an ungated shared expert are different layers */
	a.shared_ffn = b.shared_ffn = 8;
	b = a;
	b.shared_gated = 1;
	assert_true(rmoe_config_hash(&a) != rmoe_config_hash(&b));
}

/* Preset name, which must exist, with want's shape (Table 3) and routing
 * (the model's published configuration). */
static const struct rmoe_preset *expect_preset(const char *name, struct rmoe_preset want)
{
	const struct rmoe_preset *p = rmoe_preset_find(name);
	assert_non_null(p);
	assert_int_equal(p->hidden, want.hidden);
	assert_int_equal(p->ffn, want.ffn);
	assert_int_equal(p->experts, want.experts);
	assert_int_equal(p->topk, want.topk);
	assert_int_equal(p->norm_topk, want.norm_topk);
	assert_int_equal(p->shared_ffn, want.shared_ffn);
	return p;
}

static void test_config_presets_match_table3(void **state)
{
	(void)state;
	const struct rmoe_preset *p = expect_preset("qwen3-30b-a3b", (struct rmoe_preset){
		.hidden = 2048, .ffn = 768, .experts = 128, .topk = 8, .norm_topk = 1, .shared_ffn = 0});
	assert_int_equal(p->layers, 48);
	p = expect_preset("Qwen2-57B-A14B", (struct rmoe_preset){
		.hidden = 3584, .ffn = 2560, .experts = 64, .topk = 8, .norm_topk = 0, .shared_ffn = 20480});
	assert_int_equal(p->shared_gated, 1);
	struct rmoe_layer_config cfg;
	char msg[256];
	rmoe_layer_config_init(&cfg);
	assert_int_equal(rmoe_preset_apply("Qwen2-57B-A14B", 16, &cfg, msg, sizeof(msg)), 0);
	assert_int_equal(cfg.norm_topk, 0);
	assert_int_equal(cfg.shared_ffn, 1280);
	assert_int_equal(cfg.shared_gated, 1);
	assert_int_equal(rmoe_config_check(&cfg, 4), 0);
	p = rmoe_preset_find("MoE-K16");
	assert_non_null(p);
	assert_int_equal(p->topk, 16);
	assert_int_equal(p->norm_topk, 1);
	assert_int_equal(p->shared_ffn, 0);
	assert_null(rmoe_preset_find("Qwen4"));
	size_t n;
	rmoe_preset_list(&n);
	assert_int_equal(n, 13);
}

static void test_config_dispatch_names_round_trip(void **state)
{
	(void)state;
	const enum rmoe_dispatch all[] = {RMOE_DISPATCH_ALLTOALL, RMOE_DISPATCH_RING_EXPERT,
	                                  RMOE_DISPATCH_RING_TOKEN, RMOE_DISPATCH_AUTO};
	for (unsigned i = 0; i < 4; i++) {
		enum rmoe_dispatch d;
		assert_int_equal(rmoe_dispatch_parse(rmoe_dispatch_name(all[i]), &d), 0);
		assert_int_equal(d, all[i]);
	}
	enum rmoe_dispatch d;
	assert_int_equal(rmoe_dispatch_parse("rnig", &d), RMOE_EINVAL);
	assert_non_null(strstr(rmoe_strerror(RMOE_EINVAL), "'rnig'"));
}

struct parsed {
	int64_t tokens, cap;
	double scale;
	const char *name;
	int flag, g_tokens;
};

static int parse(struct parsed *p, int argc, char **argv, char *msg)
{
	struct rmoe_opt o[] = {
		{"tokens", RMOE_OPT_INT, &p->tokens, 1, 1000, "T", "tokens", &p->g_tokens},
		{"mem-cap", RMOE_OPT_SIZE, &p->cap, 1, 1e15, "BYTES", "cap", NULL},
		{"scale", RMOE_OPT_DOUBLE, &p->scale, 1, 64, "S", "scale", NULL},
		{"name", RMOE_OPT_STRING, &p->name, 0, 0, "N", "name", NULL},
		{"check", RMOE_OPT_FLAG, &p->flag, 0, 0, NULL, "flag", NULL},
	};
	return rmoe_opts_parse(o, 5, argc, argv, 1, msg, 256);
}

static void test_config_opts_parse_values(void **state)
{
	(void)state;
	struct parsed p = {0};
	char msg[256];
	char *argv[] = {"x", "--tokens", "12", "--mem-cap=1.5G", "--scale", "8", "--name=a", "--check"};
	assert_int_equal(parse(&p, 8, argv, msg), 0);
	assert_int_equal(p.tokens, 12);
	assert_true(p.g_tokens);
	assert_int_equal(p.cap, (int64_t)(1.5 * 1024 * 1024 * 1024));
	assert_true(p.scale == 8.0);
	assert_string_equal(p.name, "a");
	assert_int_equal(p.flag, 1);
	char *help[] = {"x", "--bogus", "--help"};
	assert_int_equal(parse(&p, 3, help, msg), 1);
}

/* The parser refuses the command line "x" followed by the words given
 * (NULL-terminated), with a message naming needle. */
static void expect_opt_error(const char *needle, ...)
{
	char *argv[8] = {"x"};
	int argc = 1;
	va_list words;
	va_start(words, needle);
	for (char *w; (w = va_arg(words, char *)) != NULL;) {
		assert_true(argc < 8);
		argv[argc++] = w;
	}
	va_end(words);
	struct parsed p = {0};
	char msg[256] = "";
	assert_int_equal(parse(&p, argc, argv, msg), RMOE_EINVAL);
	if (!strstr(msg, needle))
		fail_msg("message '%s' does not mention '%s'", msg, needle);
}

static void test_config_opts_errors_name_the_option(void **state)
{
	(void)state;
	expect_opt_error("did you mean --tokens", "--tokns", "3", NULL);
	expect_opt_error("--tokens needs a value", "--tokens", NULL);
	expect_opt_error("--tokens 'abc'", "--tokens", "abc", NULL);
	expect_opt_error("from 1 to 1000", "--tokens", "0", NULL);
	expect_opt_error("--mem-cap '12Q'", "--mem-cap", "12Q", NULL);
	expect_opt_error("--scale 'nan'", "--scale", "nan", NULL);
	expect_opt_error("takes no value", "--check=1", NULL);
	expect_opt_error("unexpected argument", "tokens", NULL);
	expect_opt_error("non-empty", "--name", "", NULL);
	expect_opt_error("--tokens", "--tokens", "99999999999999999999999", NULL);
}

RMOE_TEST_MAIN(NULL, NULL,
               cmocka_unit_test(test_config_defaults_pass),
               cmocka_unit_test(test_config_rejects_bad_values),
               cmocka_unit_test(test_config_hash_tracks_fields),
               cmocka_unit_test(test_config_presets_match_table3),
               cmocka_unit_test(test_config_dispatch_names_round_trip),
               cmocka_unit_test(test_config_opts_parse_values),
               cmocka_unit_test(test_config_opts_errors_name_the_option))
