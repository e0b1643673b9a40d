/* The planner's routing choice: the Table 2 volumes by hand, the mode
 * against the paper's trend, and its flip at the volume crossover over seeded
 * random shapes, on the ring of the shipped mn5-acc description. No MPI
 * initialisation, no StarPU. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmocka_main.h"
#include "rmoe_plan.h"
#include "rmoe_system.h"
#include "planner_check.h"
#include "seeded.h"

/* The ring of mn5-acc with EP ranks placed four per node. */
static struct rmoe_ring_edge *mn5_ring(int ep, struct rmoe_topology *t, double *tflops)
{
	struct rmoe_cluster c;
	int rc = rmoe_cluster_load(RMOE_SOURCE_DIR "/scheduler/clusters/mn5-acc.cluster", &c);
	if (rc)
		fail_msg("%s", rmoe_strerror(rc));
	assert_int_equal(rmoe_topology_simulated(&c, NULL, ep, t), 0);
	rmoe_cluster_free(&c);
	int *order = malloc(sizeof(int) * (size_t)ep);
	struct rmoe_ring_edge *e = malloc(sizeof(*e) * (size_t)ep);
	assert_int_equal(rmoe_ring_order(t, order), 0);
	assert_int_equal(rmoe_ring_edges(t, order, e), 0);
	free(order);
	*tflops = t->bf16_tflops;
	return e;
}

static void test_planner_table2_volumes_by_hand(void **state)
{
	(void)state;
	/* Qwen3-30B-A3B's layer at the paper's §2 profile (B=24, S=16384,
	 * SP=2, CP=4: 49152 tokens per rank), EP=8, ETP=2, bf16. */
	struct rmoe_routing_problem p = {.hidden = 2048, .ffn = 768, .experts = 128, .topk = 8,
	                                 .tokens = 24 * 16384 / (2 * 4), .ep = 8, .etp = 2,
	                                 .dtype = RMOE_DTYPE_BF16};
	assert_int_equal(rmoe_routing_check(&p), 0);
	assert_int_equal(rmoe_routing_metadata_bytes(8), 64);
	/* E/EP = 16 experts of 3 x 2048 x (768/2) bf16 values. */
	assert_true(rmoe_expert_hop_bytes(&p, 0) == 16.0 * 3 * 2048 * 384 * 2);
	assert_true(rmoe_expert_hop_bytes(&p, 0) == 75497472.0);
	assert_true(rmoe_expert_hop_bytes(&p, 1) == 150994944.0);
	/* 49152 tokens of 2048 x 2 bytes + 8 x (4 + 4) bytes of metadata. */
	assert_true(rmoe_token_hop_bytes(&p, 0) == 49152.0 * 4160);
	assert_true(rmoe_token_hop_bytes(&p, 0) == 204472320.0);
	assert_true(rmoe_token_hop_bytes(&p, 1) == 408944640.0);
	/* 49152 x 8 / 8 pairs of 2 x 3 x 2048 x 384 flops; backward 3x. */
	assert_true(rmoe_hop_flops(&p, 0) == 49152.0 * 4718592);
	assert_true(rmoe_hop_flops(&p, 1) == 3 * 49152.0 * 4718592);
	/* Carried by the implementation: the output accumulator too (2048 x 2
	 * bytes more per token); backward x, dy, dx and order, weights, dg. */
	assert_true(rmoe_token_hop_bytes_carried(&p, 0) == 49152.0 * 8256);
	assert_true(rmoe_token_hop_bytes_carried(&p, 1) == 49152.0 * (3 * 4096 + 96));
	/* Forward and backward together: token routing below 3 x 75497472 /
	 * (5 x 4096 + 160) = 10973.5 tokens. */
	assert_int_equal(rmoe_routing_crossover_tokens(&p), 10974);

	struct rmoe_topology t;
	double tflops;
	struct rmoe_ring_edge *e = mn5_ring(8, &t, &tflops);
	struct rmoe_routing_choice ch;
	assert_int_equal(rmoe_routing_choose(&p, e, 8, tflops, &ch), 0);
	/* Slowest edge: the network, 24 GB/s and 2 us in mn5-acc.cluster. */
	double transfer = 2e-6 + 75497472.0 / 24e9, compute = 49152.0 * 4718592 / 400e12;
	assert_int_equal(e[ch.expert[0].slowest_edge].link, RMOE_LINK_NETWORK);
	assert_true(fabs(ch.expert[0].transfer_s - transfer) < 1e-12);
	assert_true(fabs(ch.expert[0].compute_s - compute) < 1e-12);
	assert_true(fabs(ch.expert[0].exposed_s - (transfer - compute)) < 1e-12);
	assert_true(fabs(ch.expert[0].hidden_fraction - compute / transfer) < 1e-12);
	assert_true(ch.pairs_per_hop == 49152.0);
	assert_int_equal(ch.mode, RMOE_DISPATCH_RING_EXPERT);
	assert_non_null(strstr(ch.reason, "expert routing: 75.5 MB/hop of expert weights vs 405.8 MB/hop"));
	assert_true(ch.token_table2[0] == 204472320.0);
	free(e);
	rmoe_topology_free(&t);

	p.etp = 5;
	assert_int_equal(rmoe_routing_check(&p), RMOE_EINVAL);
	assert_non_null(strstr(rmoe_strerror(RMOE_EINVAL), "ETP = 5"));
	p.etp = 1;
	p.ep = 3;
	assert_int_equal(rmoe_routing_check(&p), RMOE_EINVAL);
	assert_non_null(strstr(rmoe_strerror(RMOE_EINVAL), "EP = 3"));
}

static enum rmoe_dispatch choose(struct rmoe_routing_problem p, const struct rmoe_ring_edge *e, double tflops)
{
	struct rmoe_routing_choice ch;
	int rc = rmoe_routing_choose(&p, e, (int)p.ep, tflops, &ch);
	if (rc)
		fail_msg("%s", rmoe_strerror(rc));
	return ch.mode;
}

static void test_planner_mode_follows_paper_trend(void **state)
{
	(void)state;
	struct rmoe_topology t;
	double tflops;
	struct rmoe_ring_edge *e = mn5_ring(8, &t, &tflops);
	/* §4.5: MoE-E384 with FFN 2048 at a short sequence (20K, b=12,
	 * SP*CP=8): the expert weights dwarf the tokens. */
	struct rmoe_routing_problem wide = {.hidden = 2048, .ffn = 2048, .experts = 384, .topk = 12,
	                                    .tokens = 12 * 20480 / 8, .ep = 8, .etp = 1,
	                                    .dtype = RMOE_DTYPE_BF16};
	assert_int_equal(choose(wide, e, tflops), RMOE_DISPATCH_RING_TOKEN);
	/* §4.2: E128 (Qwen3-30B-A3B's experts) at a long sequence (98K, b=12). */
	struct rmoe_routing_problem qwen = {.hidden = 2048, .ffn = 768, .experts = 128, .topk = 8,
	                                    .tokens = 12 * 98304 / 8, .ep = 8, .etp = 1,
	                                    .dtype = RMOE_DTYPE_BF16};
	assert_int_equal(choose(qwen, e, tflops), RMOE_DISPATCH_RING_EXPERT);
	/* The same E128 layer at a very short sequence flips to token routing;
	 * E384/F2048 stays on tokens even at the longest sequence tested. */
	qwen.tokens = 1024;
	assert_int_equal(choose(qwen, e, tflops), RMOE_DISPATCH_RING_TOKEN);
	wide.tokens = 12 * 98304 / 8;
	assert_int_equal(choose(wide, e, tflops), RMOE_DISPATCH_RING_TOKEN);
	/* §3.2: high ETP shrinks the expert volume and favours expert routing. */
	wide.etp = 64;
	assert_int_equal(choose(wide, e, tflops), RMOE_DISPATCH_RING_EXPERT);
	free(e);
	rmoe_topology_free(&t);
}

/* Whether every pass of both modes moves more time than it computes: there
 * the exposed time is the transfer less a common compute, so the choice
 * follows the bytes and flips at the volume crossover. */
static int transfer_bound(const struct rmoe_routing_problem *p, const struct rmoe_ring_edge *e, double rate)
{
	struct rmoe_routing_choice ch;
	if (rmoe_routing_choose(p, e, (int)p->ep, rate, &ch))
		return 0;
	for (int b = 0; b < 2; b++)
		if (ch.expert[b].transfer_s <= ch.expert[b].compute_s ||
		    ch.token[b].transfer_s <= ch.token[b].compute_s)
			return 0;
	return 1;
}

static void test_planner_mode_flips_at_crossover(void **state)
{
	(void)state;
	const int eps[] = {1, 4, 8, 16};
	int checked = 0;
	for (int ei = 0; ei < 4; ei++) {
		struct rmoe_topology t;
		double tflops;
		struct rmoe_ring_edge *e = mn5_ring(eps[ei], &t, &tflops);
		for (uint64_t trial = 0; trial < 40; trial++) {
			uint64_t r = rmoe_seeded_u64(SEED, 77, trial);
			struct rmoe_routing_problem p = {
				.hidden = 256 * (int64_t)(1 + r % 16), .ffn = 128 * (int64_t)(1 + (r >> 8) % 24),
				.experts = eps[ei] * (int64_t)(1 + (r >> 16) % 32), .topk = 1 + (int64_t)((r >> 24) % 8),
				.ep = eps[ei], .etp = (r >> 32) % 2 ? 2 : 1,
				.dtype = (r >> 40) % 2 ? RMOE_DTYPE_BF16 : RMOE_DTYPE_F32};
			if (p.topk > p.experts)
				p.topk = p.experts;
			int64_t x = rmoe_routing_crossover_tokens(&p);
			assert_true(x > 1);
			double rate = p.dtype == RMOE_DTYPE_BF16 ? tflops : t.f32_tflops;
			/* One rank moves nothing: both modes tie and the volume decides. */
			struct rmoe_routing_problem lo = p, hi = p;
			lo.tokens = x - 1;
			hi.tokens = x;
			if (eps[ei] > 1 && !(transfer_bound(&lo, e, rate) && transfer_bound(&hi, e, rate)))
				continue;
			checked++;
			assert_true(rmoe_token_hop_bytes_carried(&lo, 0) + rmoe_token_hop_bytes_carried(&lo, 1) <
			            rmoe_expert_hop_bytes(&lo, 0) + rmoe_expert_hop_bytes(&lo, 1));
			assert_int_equal(choose(lo, e, rate), RMOE_DISPATCH_RING_TOKEN);
			assert_true(rmoe_token_hop_bytes_carried(&hi, 0) + rmoe_token_hop_bytes_carried(&hi, 1) >=
			            rmoe_expert_hop_bytes(&hi, 0) + rmoe_expert_hop_bytes(&hi, 1));
			assert_int_equal(choose(hi, e, rate), RMOE_DISPATCH_RING_EXPERT);
		}
		free(e);
		rmoe_topology_free(&t);
	}
	/* Most seeded shapes are transfer-bound on this cluster's network. */
	assert_true(checked >= 60);
}

RMOE_TEST_MAIN(NULL, NULL,
               cmocka_unit_test(test_planner_table2_volumes_by_hand),
               cmocka_unit_test(test_planner_mode_follows_paper_trend),
               cmocka_unit_test(test_planner_mode_flips_at_crossover))
