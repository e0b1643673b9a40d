/* The time bound per dispatcher (scheduler/time_bound.c) against numbers
 * worked by hand for a small layer on the small description of
 * planner_check.c: two nodes of two GPUs over PCIe (50 GB/s, 3 us), the
 * network at 25 GB/s and 2 us, 100 TFLOP/s bf16, 10 TFLOP/s f32.
 *
 * The layer: H = 64, F = 32, E = 8, K = 2, T = 448 tokens per rank, bf16
 * (s = 2 bytes), EP = 4 (E/EP = 2 experts a rank). Block placement: ranks
 * 0, 1 on node 0 and 2, 3 on node 1; the ring 0 1 2 3 has edges 0->1 and
 * 2->3 over PCIe and 1->2, 3->0 over the network. No MPI, no StarPU. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmocka_main.h"
#include "planner_check.h"
#include "rmoe_plan.h"
#include "rmoe_time_bound.h"

/* Relative tolerance of a computed figure against its hand-worked value:
 * the sums are of a few exact products, so only rounding separates them. */
#define REL 1e-12

#define assert_close(got, want) assert_true(fabs((got) - (want)) <= REL * fabs(want) + 1e-18)

struct bound_fixture {
	struct rmoe_cluster c;
	struct rmoe_topology t;
	struct rmoe_ring_edge edges[4];
	struct rmoe_routing_problem p;
	struct rmoe_bound_input in;
};

static struct rmoe_routing_problem small_layer(int64_t ep, enum rmoe_dtype dtype)
{
	return (struct rmoe_routing_problem){.hidden = 64, .ffn = 32, .experts = 8, .topk = 2, .tokens = 448,
	                                     .ep = ep, .etp = 1, .dtype = dtype};
}

/* The small description (its line of key replaced, with key) on nranks
 * simulated ranks, its planned ring, the layer on them. */
static int fixture(void **state, const char *key, const char *replacement, int nranks, enum rmoe_dtype dtype)
{
	struct bound_fixture *f = calloc(1, sizeof(*f));
	char *text = variant(key, replacement);
	int order[4];
	int rc = !f || !text || parse_str(text, &f->c) || rmoe_topology_simulated(&f->c, NULL, nranks, &f->t) ||
	         rmoe_ring_order(&f->t, order) || rmoe_ring_edges(&f->t, order, f->edges);
	free(text);
	if (rc)
		return -1;
	f->p = small_layer(nranks, dtype);
	f->in = (struct rmoe_bound_input){.p = &f->p, .t = &f->t, .edges = f->edges,
	                                  .tflops = dtype == RMOE_DTYPE_BF16 ? f->t.bf16_tflops : f->t.f32_tflops};
	*state = f;
	return 0;
}

static int setup_four(void **state)
{
	return fixture(state, NULL, "", 4, RMOE_DTYPE_BF16);
}

static int setup_one_nic(void **state)
{
	return fixture(state, "ranks_per_node", "ranks_per_node = 2\nnics_per_node = 1", 4, RMOE_DTYPE_BF16);
}

static int setup_one_rank(void **state)
{
	return fixture(state, NULL, "", 1, RMOE_DTYPE_F32);
}

static int teardown(void **state)
{
	struct bound_fixture *f = *state;
	rmoe_topology_free(&f->t);
	rmoe_cluster_free(&f->c);
	free(f);
	return 0;
}

static struct rmoe_time_bound bound_of(const struct bound_fixture *f, enum rmoe_dispatch d)
{
	struct rmoe_time_bound b;
	assert_int_equal(rmoe_time_bound(rmoe_dispatcher_of(d), &f->in, &b), 0);
	return b;
}

/* Every dispatcher computes the same GEMMs (even routing: T*K = 896 pairs
 * a rank), at 100 TFLOP/s:
 *   forward: router 2*T*H*E = 458752; experts 3 GEMMs of 2*896*64*32 =
 *     11010048; 11468800 flops, 0.114688 us;
 *   backward: router twice, 917504; the recompute's gate and up, 7340032;
 *     six GEMMs of the backward, 22020096; 30277632 flops, 0.30277632 us;
 *   both: 0.41746432 us. */
static void assert_compute(const struct rmoe_time_bound *b)
{
	assert_close(b->pass[0].flops, 11468800.0);
	assert_close(b->pass[1].flops, 30277632.0);
	assert_close(b->compute_s, 0.41746432e-6);
}

/* wire and bound of b from its hand-worked pass wires (us): the bound is
 * the wire here, compute being far smaller. */
static void assert_wire(const struct rmoe_time_bound *b, double fwd_us, double bwd_us, enum rmoe_link_class link)
{
	assert_close(b->pass[0].wire_s, fwd_us * 1e-6);
	assert_close(b->pass[1].wire_s, bwd_us * 1e-6);
	assert_int_equal(b->pass[0].link, link);
	assert_close(b->bound_s, (fwd_us + bwd_us) * 1e-6);
	assert_close(b->serial_s, (fwd_us + bwd_us) * 1e-6 + 0.41746432e-6);
	assert_compute(b);
}

/* Ring expert routing (ring_expert.c): a partition is E/EP experts of
 * 3*H*F*s = 12288 bytes, 24576 bytes. Forward 3 hops: 73728 bytes;
 * backward 3 hops of weights and gradients and the gradients' return:
 * 3*49152 + 24576 = 172032. The network edges are the slowest (2 us +
 * 73728 B / 25 GB/s = 4.949 us against PCIe's 3 + 1.475): forward 2.94912
 * us + 3 hops * 2 us = 8.94912 us, backward 6.88128 + 6 = 12.88128 us. */
static void test_planner_bound_ring_expert(void **state)
{
	struct rmoe_time_bound b = bound_of(*state, RMOE_DISPATCH_RING_EXPERT);
	assert_close(b.pass[0].bytes, 73728.0);
	assert_close(b.pass[1].bytes, 172032.0);
	assert_wire(&b, 8.94912, 12.88128, RMOE_LINK_NETWORK);
}

/* Ring token routing (ring_token.c): the counts, 3 peers * E * 4 = 96
 * bytes; a hop carries T*(2*H*s + 8K) = 448*272 = 121856 bytes forward
 * and T*(3*H*s + 12K) = 448*408 = 182784 backward; the return of y (T*H*s
 * = 57344) or of dx and dg (T*(H*s + 4K) = 60928). Forward 96 + 3*121856 +
 * 57344 = 423008 bytes, 16.92032 + 6 = 22.92032 us; backward 96 + 548352 +
 * 60928 = 609376 bytes, 24.37504 + 6 = 30.37504 us. */
static void test_planner_bound_ring_token(void **state)
{
	struct rmoe_time_bound b = bound_of(*state, RMOE_DISPATCH_RING_TOKEN);
	assert_close(b.pass[0].bytes, 423008.0);
	assert_close(b.pass[1].bytes, 609376.0);
	assert_wire(&b, 22.92032, 30.37504, RMOE_LINK_NETWORK);
}

/* a2a (alltoall_fwd.c, alltoall_bwd.c): 3/4 of T*K pairs leave, 672 rows.
 * Forward the counts (96) and 672 rows out and 672 back of H*s = 128
 * bytes: 172128 bytes; backward x, dy and the weight out, dx and dg back,
 * 672*(3*128 + 8) = 263424. A third to each peer: the node-mate over PCIe
 * (forward 3 + 57376 B / 50 GB/s = 4.14752 us), two thirds through the
 * adapter (2 + 114752 B / 25 GB/s = 6.59008 us), the slower; backward
 * 2 + 175616 / 25e3 = 9.02464 us. */
static void test_planner_bound_alltoall(void **state)
{
	struct rmoe_time_bound b = bound_of(*state, RMOE_DISPATCH_ALLTOALL);
	assert_close(b.pass[0].bytes, 172128.0);
	assert_close(b.pass[1].bytes, 263424.0);
	assert_wire(&b, 6.59008, 9.02464, RMOE_LINK_NETWORK);
}

/* a2a-megatron (alltoall_megatron.c): a2a's bytes and the probabilities'
 * own exchange forward, 672*4: 174816 bytes, 2 + 116544 / 25e3 = 6.66176
 * us; backward a2a's. */
static void test_planner_bound_alltoall_megatron(void **state)
{
	struct rmoe_time_bound b = bound_of(*state, RMOE_DISPATCH_ALLTOALL_MEGATRON);
	assert_close(b.pass[0].bytes, 174816.0);
	assert_close(b.pass[1].bytes, 263424.0);
	assert_wire(&b, 6.66176, 9.02464, RMOE_LINK_NETWORK);
}

/* a2a-deepep (alltoall_deepep.c): a token misses a rank's 2 experts with
 * probability 6/8 * 5/7 = 15/28; a block's T*K/EP = 224 pairs hold 224 *
 * (13/28) / (K*2/E) = 208 distinct tokens. Forward the counts (3 peers *
 * (E + EP) * 4 = 144) and per peer 208 rows out with their K codes and
 * weights and 208 back: 144 + 3*208*(256 + 16) = 169872 bytes, 2 +
 * 113248 / 25e3 = 6.52992 us; backward x and dy out with codes and
 * weights, dx and dg back: 3*208*(384 + 24) = 254592 bytes, 2 + 169728 /
 * 25e3 = 8.78912 us. */
static void test_planner_bound_alltoall_deepep(void **state)
{
	struct rmoe_time_bound b = bound_of(*state, RMOE_DISPATCH_ALLTOALL_DEEPEP);
	assert_close(b.pass[0].bytes, 169872.0);
	assert_close(b.pass[1].bytes, 254592.0);
	assert_wire(&b, 6.52992, 8.78912, RMOE_LINK_NETWORK);
}

/* One adapter per node: the ring's one edge leaving each node keeps it
 * whole, but an all-to-all rank shares it with its node-mate, 12.5 GB/s:
 * a2a forward 2 + 114752 / 12.5e3 = 11.18016 us, backward 2 + 175616 /
 * 12.5e3 = 16.04928 us. */
static void test_planner_bound_shared_adapter(void **state)
{
	struct rmoe_time_bound b = bound_of(*state, RMOE_DISPATCH_RING_EXPERT);
	assert_wire(&b, 8.94912, 12.88128, RMOE_LINK_NETWORK);
	b = bound_of(*state, RMOE_DISPATCH_ALLTOALL);
	assert_wire(&b, 11.18016, 16.04928, RMOE_LINK_NETWORK);
}

/* One rank, f32 at 10 TFLOP/s, with a gated shared expert of width 16:
 * nothing is sent, so the bound is the compute. Forward 11468800 flops as
 * above and the shared expert's 3 GEMMs of 2*448*64*16 = 917504:
 * 14221312 flops, 1.4221312 us; backward 30277632 and the shared
 * expert's whole recompute (gated) and six GEMMs, 9*917504: 38535168
 * flops, 3.8535168 us. */
static void test_planner_bound_one_rank(void **state)
{
	struct bound_fixture *f = *state;
	f->in.shared_ffn = 16;
	f->in.shared_gated = 1;
	for (int i = 0; i < RMOE_NDISPATCHERS - 1; i++) {
		struct rmoe_time_bound b;
		assert_int_equal(rmoe_time_bound(&rmoe_dispatchers[i], &f->in, &b), 0);
		for (int pass = 0; pass < 2; pass++) {
			assert_true(b.pass[pass].bytes == 0 && b.pass[pass].wire_s == 0);
			assert_int_equal(b.pass[pass].link, -1);
		}
		assert_close(b.pass[0].flops, 14221312.0);
		assert_close(b.pass[1].flops, 38535168.0);
		assert_close(b.bound_s, 5.275648e-6);
		assert_close(b.serial_s, b.bound_s);
	}
}

/* auto has no traffic of its own; a wrong EP or rate is refused. */
static void test_planner_bound_refuses(void **state)
{
	struct bound_fixture *f = *state;
	struct rmoe_time_bound b;
	assert_int_equal(rmoe_time_bound(rmoe_dispatcher_of(RMOE_DISPATCH_AUTO), &f->in, &b), RMOE_EINVAL);
	const struct rmoe_dispatcher *ring = rmoe_dispatcher_of(RMOE_DISPATCH_RING_EXPERT);
	struct rmoe_bound_input in = f->in;
	in.tflops = 0;
	assert_int_equal(rmoe_time_bound(ring, &in, &b), RMOE_EINVAL);
	struct rmoe_routing_problem p = f->p;
	p.ep = 2;
	in = f->in;
	in.p = &p;
	assert_int_equal(rmoe_time_bound(ring, &in, &b), RMOE_EINVAL);
	assert_non_null(strstr(rmoe_last_error_message(), "EP = 2 on 4 ranks"));
}

/* The plan carries every dispatcher's bound, as computed above, and
 * whether its peak fits the device (16 GiB: this layer does) and the cap. */
static void test_planner_bound_in_the_plan(void **state)
{
	struct bound_fixture *f = *state;
	struct rmoe_layer_config cfg;
	rmoe_layer_config_init(&cfg);
	cfg.hidden = 64, cfg.ffn = 32, cfg.experts = 8, cfg.topk = 2, cfg.tokens = 448;
	cfg.dtype = RMOE_DTYPE_BF16, cfg.dispatch = RMOE_DISPATCH_AUTO;
	struct rmoe_plan_request req = {.layer = &cfg};
	for (int64_t cap = 0; cap <= 1024; cap += 1024) {
		cfg.mem_cap = cap;
		struct rmoe_plan plan;
		assert_int_equal(rmoe_plan_make(&req, &f->t, &plan), 0);
		assert_int_equal(plan.time.rc, 0);
		assert_close(plan.time.device_tflops, 100.0);
		for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++) {
			const struct rmoe_time_bound *e = &plan.time.est[i];
			struct rmoe_time_bound b = bound_of(f, rmoe_dispatchers[i].kind);
			assert_close(e->bound_s, b.bound_s);
			assert_close(e->pass[1].bytes, b.pass[1].bytes);
			assert_int_equal(e->fits_device, 1);
			/* 1024 bytes hold no dispatcher's resident buffers */
			assert_int_equal(e->fits_cap, cap ? 0 : -1);
		}
		rmoe_plan_free(&plan);
	}
}

/* Striped crossing hops (scheduler/stripes.c). Without nics_per_node each
 * rank has an adapter: the crossing edges 1->2 and 3->0 get a stripe per
 * rank of a node, 2, relayed by each node's ranks in ring order from the
 * edge's ends: 1->2 by {1,2} (its own) and {0,3}; 3->0 by {3,0} and {2,1}.
 * The edges inside a node keep one. */
static void test_planner_bound_stripes(void **state)
{
	struct bound_fixture *f = *state;
	const int order[4] = {0, 1, 2, 3};
	int count[4];
	struct rmoe_stripe s[4 * RMOE_STRIPES_MAX];
	assert_int_equal(rmoe_ring_stripes(&f->t, order, 0, count, s), 0);
	const int want[4] = {1, 2, 1, 2};
	for (int i = 0; i < 4; i++) {
		assert_int_equal(count[i], want[i]);
		assert_int_equal(s[i * RMOE_STRIPES_MAX].out, order[i]);
		assert_int_equal(s[i * RMOE_STRIPES_MAX].in, order[(i + 1) % 4]);
	}
	assert_int_equal(s[1 * RMOE_STRIPES_MAX + 1].out, 0);
	assert_int_equal(s[1 * RMOE_STRIPES_MAX + 1].in, 3);
	assert_int_equal(s[3 * RMOE_STRIPES_MAX + 1].out, 2);
	assert_int_equal(s[3 * RMOE_STRIPES_MAX + 1].in, 1);
	/* 1: the flat ring; more than a node's ranks: as many as it has. */
	assert_int_equal(rmoe_ring_stripes(&f->t, order, 1, count, s), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(count[i], 1);
	assert_int_equal(rmoe_ring_stripes(&f->t, order, 8, count, s), 0);
	assert_int_equal(count[1], 2);
	assert_int_equal(rmoe_ring_stripes(&f->t, order, RMOE_STRIPES_MAX + 1, count, s), RMOE_EINVAL);
	assert_non_null(strstr(rmoe_last_error_message(), "stripes = 17"));
	assert_int_equal(rmoe_ring_stripes(&f->t, order, -1, count, s), RMOE_EINVAL);
}

/* The striped ring's bound: a crossing edge of 2 stripes moves at 2 *
 * min(25, 50) = 50 GB/s (the node's 2 adapters, 50 GB/s, allow it), with
 * 2 + 2 * 3 = 8 us of latency; it is still the slowest (PCIe: 3 us at 50
 * GB/s). Forward 73728 B / 50 GB/s = 1.47456 us + 3 hops * 8 = 25.47456
 * us; backward 172032 / 50e3 = 3.44064 + 24 = 27.44064 us: slower than
 * the flat ring on so small a layer, where latency rules. The plan holds
 * the same, with the striped peak; with one adapter a node nothing is
 * striped. */
static void test_planner_bound_striped_ring(void **state)
{
	struct bound_fixture *f = *state;
	const int order[4] = {0, 1, 2, 3};
	int count[4];
	struct rmoe_stripe s[4 * RMOE_STRIPES_MAX];
	assert_int_equal(rmoe_ring_stripes(&f->t, order, 0, count, s), 0);
	struct rmoe_ring_edge edges[4];
	memcpy(edges, f->edges, sizeof(edges));
	rmoe_ring_edges_striped(&f->t, count, edges);
	assert_close(edges[1].bandwidth_gbs, 50.0);
	assert_close(edges[1].latency_us, 8.0);
	assert_close(edges[0].bandwidth_gbs, f->edges[0].bandwidth_gbs);
	struct rmoe_bound_input in = f->in;
	in.edges = edges;
	struct rmoe_time_bound b;
	assert_int_equal(rmoe_time_bound(rmoe_dispatcher_of(RMOE_DISPATCH_RING_EXPERT), &in, &b), 0);
	assert_wire(&b, 25.47456, 27.44064, RMOE_LINK_NETWORK);

	struct rmoe_layer_config cfg;
	rmoe_layer_config_init(&cfg);
	cfg.hidden = 64, cfg.ffn = 32, cfg.experts = 8, cfg.topk = 2, cfg.tokens = 448;
	cfg.dtype = RMOE_DTYPE_BF16;
	struct rmoe_plan_request req = {.layer = &cfg};
	struct rmoe_plan plan;
	assert_int_equal(rmoe_plan_make(&req, &f->t, &plan), 0);
	assert_int_equal(plan.time.stripes, 2);
	assert_close(plan.time.striped[0].bound_s, b.bound_s);
	/* Its peak holds the relays' pieces: above the flat ring's, the same
	 * as the layer's own (stripes 0: as planned), and it fits the
	 * description's 16 GiB. */
	struct rmoe_mem_config flat;
	struct rmoe_mem_estimate fe;
	rmoe_mem_config_from_layer(&flat, &cfg, 4);
	assert_int_equal(rmoe_memory_model(RMOE_DISPATCH_RING_EXPERT, &flat, &fe), 0);
	assert_true(plan.time.striped_peak[0] > fe.peak);
	assert_int_equal(plan.time.striped_peak[0], plan.memory.est[0].peak);
	assert_int_equal(plan.time.striped[0].fits_device, 1);
	assert_int_equal(plan.time.striped[0].fits_cap, -1);
	rmoe_plan_free(&plan);
}

static void test_planner_bound_one_adapter_no_stripes(void **state)
{
	struct bound_fixture *f = *state;
	const int order[4] = {0, 1, 2, 3};
	int count[4];
	struct rmoe_stripe s[4 * RMOE_STRIPES_MAX];
	assert_int_equal(rmoe_ring_stripes(&f->t, order, 0, count, s), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(count[i], 1);
}

RMOE_TEST_MAIN(NULL, NULL, cmocka_unit_test_setup_teardown(test_planner_bound_ring_expert, setup_four, teardown),
               cmocka_unit_test_setup_teardown(test_planner_bound_stripes, setup_four, teardown),
               cmocka_unit_test_setup_teardown(test_planner_bound_striped_ring, setup_four, teardown),
               cmocka_unit_test_setup_teardown(test_planner_bound_one_adapter_no_stripes, setup_one_nic, teardown),
               cmocka_unit_test_setup_teardown(test_planner_bound_ring_token, setup_four, teardown),
               cmocka_unit_test_setup_teardown(test_planner_bound_alltoall, setup_four, teardown),
               cmocka_unit_test_setup_teardown(test_planner_bound_alltoall_megatron, setup_four, teardown),
               cmocka_unit_test_setup_teardown(test_planner_bound_alltoall_deepep, setup_four, teardown),
               cmocka_unit_test_setup_teardown(test_planner_bound_shared_adapter, setup_one_nic, teardown),
               cmocka_unit_test_setup_teardown(test_planner_bound_one_rank, setup_one_rank, teardown),
               cmocka_unit_test_setup_teardown(test_planner_bound_refuses, setup_four, teardown),
               cmocka_unit_test_setup_teardown(test_planner_bound_in_the_plan, setup_four, teardown))
