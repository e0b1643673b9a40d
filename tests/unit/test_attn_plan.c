/* The selective attention recomputation planner (paper §3.4) on tiny
 * configurations whose costs and greedy choices are worked out by hand.
 *
 * The tiny layer: b=1, S=8, 2 heads, 1 KV head, d=4, H=8, TP=CP=1, no SP,
 * 2-byte activations. Per layer:
 *   keep-core  O 1*8*2*4*2 = 128 + LSE 2*8*4 = 64 -> 192 bytes;
 *              core forward 4*1*8*2*4*(8/2) = 1024 FLOPs (ratio 5.33)
 *   keep-qkv   + Q,K,V 8*(2+2*1)*4*2 = 256 bytes; + QKV 2*8*8*4*4 = 2048 FLOPs (ratio 8)
 *   keep-all   + norm output 8*8*2 = 128 bytes; + RMSNorm 4*8*8 = 256 FLOPs (ratio 2)
 *   step       forward 256+2048+1024+1024 = 4352, backward 256+2*3072+2.5*1024
 *              = 8960, recomputation 3328: 16640 FLOPs
 * Two layers: checkpoints 2*8*8*2 = 256 bytes; recompute transient 2*576 =
 * 1152. With model states 1000, other activations 100 and an MoE peak of
 * 2000, the full-recomputation peak is 1000+256+100+2000 = 3356 bytes. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cmocka_main.h"
#include "relaymoe/relaymoe.h"
#include "rmoe_attn_plan.h"

#define PEAK_FULL 3356

static struct rmoe_attn_plan_input tiny(int64_t budget)
{
	/* Every field not named is 0 (no window, no SP, no MoE throughput). */
	return (struct rmoe_attn_plan_input){
		.layers = 2, .heads = 2, .kv_heads = 1, .head_dim = 4, .hidden = 8,
		.seq_len = 8, .micro_batch = 1, .tp = 1, .cp = 1, .ep = 1, .dtype_bytes = 2,
		.model_state_bytes = 1000, .other_activation_bytes = 100, .moe_peak_bytes = 2000,
		.device_bytes = PEAK_FULL + budget,
	};
}

static void test_attn_plan_layer_costs_by_hand(void **state)
{
	(void)state;
	struct rmoe_attn_plan_input in = tiny(0);
	struct rmoe_attn_layer_cost c;
	assert_int_equal(rmoe_attn_layer_cost(&in, 0, &c), 0);
	assert_int_equal(c.bytes[RMOE_ATTN_RECOMPUTE], 0);
	assert_int_equal(c.bytes[RMOE_ATTN_KEEP_CORE], 192);
	assert_int_equal(c.bytes[RMOE_ATTN_KEEP_QKV], 448);
	assert_int_equal(c.bytes[RMOE_ATTN_KEEP_ALL], 576);
	assert_true(c.flops_saved[RMOE_ATTN_KEEP_CORE] == 1024.0);
	assert_true(c.flops_saved[RMOE_ATTN_KEEP_QKV] == 3072.0);
	assert_true(c.flops_saved[RMOE_ATTN_KEEP_ALL] == 3328.0);
	assert_true(c.forward_flops == 4352.0);
	assert_true(c.step_flops == 16640.0);
}

static void test_attn_plan_peak_and_budget(void **state)
{
	(void)state;
	struct rmoe_attn_plan_input in = tiny(1023);
	struct rmoe_attn_plan p;
	assert_int_equal(rmoe_attn_plan(&in, &p), 0);
	assert_int_equal(p.checkpoint_bytes, 256);
	assert_int_equal(p.recompute_transient_bytes, 1152);
	assert_int_equal(p.peak_full_bytes, PEAK_FULL);
	assert_int_equal(p.budget_bytes, 1023);
	assert_true(p.fits);
	assert_true(p.step_flops_full == 33280.0);
	/* The recompute transient counts when it exceeds the MoE peak. */
	in.moe_peak_bytes = 1000;
	assert_int_equal(rmoe_attn_plan(&in, &p), 0);
	assert_int_equal(p.peak_full_bytes, 1000 + 256 + 100 + 1152);
}

/* Budget 1023: layer 0 keep-core (192), layer 0 keep-qkv (ratio 8 beats
 * layer 1's 5.33; 448), layer 1 keep-core (640), layer 1 keep-qkv (896);
 * keep-all of layer 0 (896+128 = 1024) and of layer 1 are refused. */
static void test_attn_plan_greedy_two_layers_qkv(void **state)
{
	(void)state;
	struct rmoe_attn_plan_input in = tiny(1023);
	struct rmoe_attn_plan p;
	assert_int_equal(rmoe_attn_plan(&in, &p), 0);
	assert_int_equal(p.keep[0], RMOE_ATTN_KEEP_QKV);
	assert_int_equal(p.keep[1], RMOE_ATTN_KEEP_QKV);
	assert_int_equal(p.used_bytes, 896);
	assert_int_equal(p.peak_plan_bytes, PEAK_FULL + 896);
	assert_int_equal(p.retained_layers, 2);
	assert_int_equal(p.full_layers, 0);
	assert_int_equal(p.at_level[RMOE_ATTN_KEEP_QKV], 2);
	assert_int_equal(p.options_taken, 4);
	assert_int_equal(p.options_refused, 2);
	assert_true(p.flops_saved == 6144.0);
	/* 33280 / (33280 - 6144) */
	assert_true(fabs(p.predicted_gain - 33280.0 / 27136.0) < 1e-12);
}

/* Budget 770: as above up to 640 bytes, then layer 1's keep-qkv (896) does
 * not fit and ends layer 1 at keep-core, but layer 0's keep-all (768) does. */
static void test_attn_plan_greedy_skips_and_continues(void **state)
{
	(void)state;
	struct rmoe_attn_plan_input in = tiny(770);
	struct rmoe_attn_plan p;
	assert_int_equal(rmoe_attn_plan(&in, &p), 0);
	assert_int_equal(p.keep[0], RMOE_ATTN_KEEP_ALL);
	assert_int_equal(p.keep[1], RMOE_ATTN_KEEP_CORE);
	assert_int_equal(p.used_bytes, 768);
	assert_int_equal(p.retained_layers, 2);
	assert_int_equal(p.full_layers, 1);
	assert_true(p.flops_saved == 3328.0 + 1024.0);
}

static void test_attn_plan_no_budget_and_everything(void **state)
{
	(void)state;
	struct rmoe_attn_plan_input in = tiny(0);
	struct rmoe_attn_plan p;
	assert_int_equal(rmoe_attn_plan(&in, &p), 0);
	assert_int_equal(p.retained_layers, 0);
	assert_int_equal(p.used_bytes, 0);
	assert_true(p.predicted_gain == 1.0);
	/* Room for everything: both layers keep all, and no recomputation is left. */
	in = tiny(1 << 20);
	assert_int_equal(rmoe_attn_plan(&in, &p), 0);
	assert_int_equal(p.full_layers, 2);
	assert_int_equal(p.used_bytes, 1152);
	assert_true(fabs(p.predicted_gain - 33280.0 / (33280.0 - 6656.0)) < 1e-12);
}

static void test_attn_plan_does_not_fit(void **state)
{
	(void)state;
	struct rmoe_attn_plan_input in = tiny(-1);
	struct rmoe_attn_plan p;
	assert_int_equal(rmoe_attn_plan(&in, &p), 0);
	assert_false(p.fits);
	assert_int_equal(p.budget_bytes, -1);
	assert_int_equal(p.retained_layers, 0);
	char text[2048];
	rmoe_attn_plan_format(&in, &p, "a2a", text, sizeof(text));
	assert_non_null(strstr(text, "does not fit"));
}

/* A smaller MoE peak (the ring's) leaves more budget, so more is kept. */
static void test_attn_plan_smaller_moe_peak_retains_more(void **state)
{
	(void)state;
	struct rmoe_attn_plan_input a2a = tiny(300), ring = a2a;
	ring.moe_peak_bytes = 1500; /* 500 bytes freed: budget 800 */
	struct rmoe_attn_plan pa, pr;
	assert_int_equal(rmoe_attn_plan(&a2a, &pa), 0);
	assert_int_equal(rmoe_attn_plan(&ring, &pr), 0);
	/* 300: layer 0 keep-core (192), then 448 and 384 do not fit: one layer. */
	assert_int_equal(pa.retained_layers, 1);
	assert_int_equal(pa.used_bytes, 192);
	/* 800: 192, 448, 640, then 896 refused, 768 taken. */
	assert_int_equal(pr.retained_layers, 2);
	assert_int_equal(pr.used_bytes, 768);
	assert_true(pr.predicted_gain > pa.predicted_gain);
}

/* MoE FLOPs join the step: forward 2*8*3*8*(2*4) = 3072 per layer, four
 * forwards' worth per step (forward, recomputation, backward). */
static void test_attn_plan_moe_flops_in_gain(void **state)
{
	(void)state;
	struct rmoe_attn_plan_input in = tiny(1023);
	in.moe_ffn = 4;
	in.moe_topk = 2;
	struct rmoe_attn_plan p;
	assert_int_equal(rmoe_attn_plan(&in, &p), 0);
	assert_true(p.step_flops_full == 33280.0 + 2 * 4 * 3072.0);
	assert_true(fabs(p.predicted_gain - 57856.0 / (57856.0 - 6144.0)) < 1e-12);
}

/* TP, CP, SP and GQA: S=32, CP=2 -> 16 query tokens; 8 heads over TP=4 ->
 * 2; 2 KV heads under TP=4 are replicated -> 1; SP: 4 norm tokens. */
static void test_attn_plan_parallel_sizes(void **state)
{
	(void)state;
	struct rmoe_attn_plan_input in = tiny(0);
	in.heads = 8;
	in.kv_heads = 2;
	in.tp = 4;
	in.cp = 2;
	in.seq_len = 32;
	in.sp = 1;
	struct rmoe_attn_layer_cost c;
	assert_int_equal(rmoe_attn_layer_cost(&in, 0, &c), 0);
	/* O 16*2*4*2 = 256 + LSE 2*16*4 = 128; QKV 16*(2+2)*4*2 = 512; norm 4*8*2 = 64 */
	assert_int_equal(c.bytes[RMOE_ATTN_KEEP_CORE], 384);
	assert_int_equal(c.bytes[RMOE_ATTN_KEEP_QKV], 896);
	assert_int_equal(c.bytes[RMOE_ATTN_KEEP_ALL], 960);
	/* core 4*16*2*4*(32/2) = 8192: queries of one CP rank see all keys */
	assert_true(c.flops_saved[RMOE_ATTN_KEEP_CORE] == 8192.0);
	struct rmoe_attn_plan p;
	in.device_bytes = 1 << 20;
	assert_int_equal(rmoe_attn_plan(&in, &p), 0);
	assert_int_equal(p.local_tokens, 16);
	assert_int_equal(p.local_heads, 2);
	assert_int_equal(p.local_kv_heads, 1);
	assert_int_equal(p.checkpoint_bytes, 2 * 4 * 8 * 2);
}

/* A sliding window of 4 in layer 0 (S=8): a query sees 4 - 16/16 = 3 keys on
 * average, core 4*8*2*4*3 = 768 (ratio 4), so layer 1 (ratio 5.33) goes
 * first; with 192 bytes only layer 1 keeps its core output. */
static void test_attn_plan_window_ranks_full_layers_first(void **state)
{
	(void)state;
	const int64_t window[2] = {4, 0};
	struct rmoe_attn_plan_input in = tiny(192);
	in.window = window;
	struct rmoe_attn_layer_cost c;
	assert_int_equal(rmoe_attn_layer_cost(&in, 0, &c), 0);
	assert_true(c.flops_saved[RMOE_ATTN_KEEP_CORE] == 768.0);
	struct rmoe_attn_plan p;
	assert_int_equal(rmoe_attn_plan(&in, &p), 0);
	assert_int_equal(p.keep[0], RMOE_ATTN_RECOMPUTE);
	assert_int_equal(p.keep[1], RMOE_ATTN_KEEP_CORE);
}

/* The largest model: with 100 * 448 bytes the greedy brings 100 layers to
 * keep-qkv (each layer's keep-qkv, ratio 8, comes before the next layer's
 * keep-core, 5.33) and refuses everything else. */
static void test_attn_plan_many_layers(void **state)
{
	(void)state;
	struct rmoe_attn_plan_input in = tiny(0);
	in.layers = RMOE_ATTN_MAX_LAYERS;
	struct rmoe_attn_plan p;
	assert_int_equal(rmoe_attn_plan(&in, &p), 0);
	in.device_bytes = p.peak_full_bytes + 100 * 448;
	assert_int_equal(rmoe_attn_plan(&in, &p), 0);
	assert_int_equal(p.retained_layers, 100);
	assert_int_equal(p.at_level[RMOE_ATTN_KEEP_QKV], 100);
	assert_int_equal(p.keep[99], RMOE_ATTN_KEEP_QKV);
	assert_int_equal(p.keep[100], RMOE_ATTN_RECOMPUTE);
	assert_int_equal(p.used_bytes, 100 * 448);
}

static void expect_invalid(struct rmoe_attn_plan_input in, const char *needle)
{
	struct rmoe_attn_plan p;
	int rc = rmoe_attn_plan(&in, &p);
	assert_int_equal(rc, RMOE_EINVAL);
	const char *msg = rmoe_strerror(rc);
	if (!strstr(msg, needle))
		fail_msg("message '%s' does not mention '%s'", msg, needle);
}

static void test_attn_plan_rejects_bad_input(void **state)
{
	(void)state;
	struct rmoe_attn_plan_input in;
	in = tiny(0); in.layers = 0; expect_invalid(in, "layers = 0");
	in = tiny(0); in.layers = RMOE_ATTN_MAX_LAYERS + 1; expect_invalid(in, "at most");
	in = tiny(0); in.heads = 3; in.tp = 2; expect_invalid(in, "heads = 3");
	in = tiny(0); in.heads = 6; in.kv_heads = 3; in.tp = 2; expect_invalid(in, "kv_heads = 3 and tp = 2");
	in = tiny(0); in.cp = 3; expect_invalid(in, "not divisible by cp = 3");
	in = tiny(0); in.tp = 2; in.seq_len = 8; in.cp = 8; in.sp = 1; expect_invalid(in, "with sp");
	in = tiny(0); in.dtype_bytes = 3; expect_invalid(in, "dtype_bytes = 3");
	in = tiny(0); in.model_state_bytes = -5; expect_invalid(in, "model_state_bytes = -5");
	in = tiny(0); in.moe_ffn = 4; expect_invalid(in, "moe_topk");
	const int64_t bad_window[2] = {0, -2};
	in = tiny(0); in.window = bad_window; expect_invalid(in, "window[1] = -2");
	in = tiny(0);
	assert_int_equal(rmoe_attn_plan(&in, NULL), RMOE_EINVAL);
	assert_int_equal(rmoe_attn_plan(NULL, NULL), RMOE_EINVAL);
}

static void test_attn_plan_format_and_json(void **state)
{
	(void)state;
	struct rmoe_attn_plan_input in = tiny(770);
	struct rmoe_attn_plan p;
	assert_int_equal(rmoe_attn_plan(&in, &p), 0);
	char text[4096], json[4096];
	int n = rmoe_attn_plan_format(&in, &p, "ring", text, sizeof(text));
	assert_int_equal(n, (int)strlen(text));
	assert_non_null(strstr(text, "(ring)"));
	assert_non_null(strstr(text, "retained: 2 of 2 attention layers (1 fully, 1 partially)"));
	assert_non_null(strstr(text, "layers: 0 keep-all, 1 keep-core"));
	/* A short buffer is cut, and the length needed still comes back. */
	char small[16];
	assert_int_equal(rmoe_attn_plan_format(&in, &p, "ring", small, sizeof(small)), n);
	assert_int_equal(strlen(small), sizeof(small) - 1);
	int m = rmoe_attn_plan_json(&in, &p, "ring", json, sizeof(json));
	assert_int_equal(m, (int)strlen(json));
	assert_non_null(strstr(json, "\"retained_layers\": 2"));
	assert_non_null(strstr(json, "\"keep\": [\"keep-all\", \"keep-core\"]"));
	assert_non_null(strstr(json, "\"used_bytes\": 768"));
	assert_true(json[0] == '{' && json[m - 1] == '}');
	assert_string_equal(rmoe_attn_keep_name(RMOE_ATTN_KEEP_QKV), "keep-qkv");
	assert_string_equal(rmoe_attn_keep_name(9), "unknown");
}

RMOE_TEST_MAIN(NULL, NULL,
               cmocka_unit_test(test_attn_plan_layer_costs_by_hand),
               cmocka_unit_test(test_attn_plan_peak_and_budget),
               cmocka_unit_test(test_attn_plan_greedy_two_layers_qkv),
               cmocka_unit_test(test_attn_plan_greedy_skips_and_continues),
               cmocka_unit_test(test_attn_plan_no_budget_and_everything),
               cmocka_unit_test(test_attn_plan_does_not_fit),
               cmocka_unit_test(test_attn_plan_smaller_moe_peak_retains_more),
               cmocka_unit_test(test_attn_plan_moe_flops_in_gain),
               cmocka_unit_test(test_attn_plan_parallel_sizes),
               cmocka_unit_test(test_attn_plan_window_ranks_full_layers_first),
               cmocka_unit_test(test_attn_plan_many_layers),
               cmocka_unit_test(test_attn_plan_rejects_bad_input),
               cmocka_unit_test(test_attn_plan_format_and_json))
