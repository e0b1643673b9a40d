/* The planner's plan for a layer on simulated ranks of the shipped mn5-acc
 * description: ring, routing and dispatch, the memory section, the fit
 * against the tightest rank's device, and hop chunks under a memory cap. No
 * MPI initialisation, no StarPU. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmocka_main.h"
#include "rmoe_plan.h"
#include "rmoe_scheduler.h"
#include "rmoe_system.h"

/* Qwen3-30B-A3B at full size (its preset), bf16, on 8 ranks of the
 * MareNostrum 5 ACC description, with the dispatch left to the plan. */
static void qwen3_layer(struct rmoe_layer_config *cfg)
{
	char msg[256];
	rmoe_layer_config_init(cfg);
	assert_int_equal(rmoe_preset_apply("Qwen3-30B-A3B", 1.0, cfg, msg, sizeof(msg)), 0);
	cfg->dtype = RMOE_DTYPE_BF16;
	cfg->dispatch = RMOE_DISPATCH_AUTO;
}

/* The plan tests' fixture: that layer on nranks simulated ranks. */
struct plan_fixture {
	struct rmoe_topology t;
	struct rmoe_layer_config cfg;
};

static int plan_setup(void **state, int nranks)
{
	struct plan_fixture *f = calloc(1, sizeof(*f));
	struct rmoe_cluster c;
	if (!f || rmoe_cluster_load(RMOE_SOURCE_DIR "/scheduler/clusters/mn5-acc.cluster", &c))
		return -1;
	int rc = rmoe_topology_simulated(&c, NULL, nranks, &f->t);
	rmoe_cluster_free(&c);
	qwen3_layer(&f->cfg);
	*state = f;
	return rc;
}

static int plan_setup_4(void **state)
{
	return plan_setup(state, 4);
}

static int plan_setup_8(void **state)
{
	return plan_setup(state, 8);
}

static int plan_teardown(void **state)
{
	struct plan_fixture *f = *state;
	rmoe_topology_free(&f->t);
	free(f);
	return 0;
}

static void test_planner_plan_for_a_simulated_cluster(void **state)
{
	struct plan_fixture *f = *state;
	struct rmoe_topology t = f->t;
	struct rmoe_layer_config cfg = f->cfg;
	struct rmoe_plan_request req = {.layer = &cfg};
	struct rmoe_plan plan;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	for (int i = 0; i < 8; i++)
		assert_int_equal(plan.order[i], i);
	assert_int_equal(plan.node_crossings, 2);
	assert_true(plan.have_layer);
	/* §3.2: long sequences of few large experts favour expert routing. */
	assert_int_equal(plan.routing.mode, RMOE_DISPATCH_RING_EXPERT);
	assert_int_equal(plan.dispatch, RMOE_DISPATCH_RING_EXPERT);
	assert_int_equal(plan.cap_rc, 0);
	assert_int_equal(plan.fit_rc, 0);
	assert_int_equal(plan.device.rank, -1);
	assert_int_equal(plan.device.memory_bytes, (int64_t)64 << 30);
	/* The memory section `relaymoe plan` printed for this configuration
	 * before the plan was one function: the largest local token counts in
	 * the device's 64 GiB; the ring's 2481676 then, 2467830 now that its
	 * crossing hops go in 4 stripes (the relays' pieces). */
	assert_int_equal(plan.stripes[0].out, 0);
	assert_int_equal(plan.stripe_count[3], 4);
	assert_int_equal(plan.memory.max_tokens[0], 2467830);
	/* a2a-megatron keeps Megatron Core 0.13's buffers (the recompute's
	 * workspace beside the exchanged dy); a2a is pipelined per peer with
	 * every peer's block in flight by default (rmoe_a2a_depth), 1139041
	 * tokens with two. */
	assert_int_equal(plan.memory.max_tokens[3], 426402);
	assert_int_equal(plan.memory.max_tokens[2], 400746);
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++) {
		struct rmoe_mem_config mc;
		struct rmoe_mem_estimate e;
		rmoe_mem_config_from_layer(&mc, &cfg, 8);
		mc.stripes = 4;
		assert_int_equal(rmoe_memory_model(rmoe_dispatchers[i].kind, &mc, &e), 0);
		assert_int_equal(plan.memory.est[i].peak, e.peak);
	}
	assert_int_equal(plan.memory.run.peak, plan.memory.est[0].peak);
	/* A requested dispatch is kept, whatever the routing choice says. */
	uint64_t digest = rmoe_plan_digest(&plan);
	rmoe_plan_free(&plan);
	cfg.dispatch = RMOE_DISPATCH_RING_TOKEN;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.dispatch, RMOE_DISPATCH_RING_TOKEN);
	assert_string_equal(plan.dispatch_reason, "token requested");
	assert_true(rmoe_plan_digest(&plan) != digest);
	rmoe_plan_free(&plan);
	cfg.dispatch = RMOE_DISPATCH_AUTO;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_true(rmoe_plan_digest(&plan) == digest);
	rmoe_plan_free(&plan);
}

/* The context's plan is the ring alone: the same order a layer's plan has. */
static void test_planner_plan_of_the_ring_only(void **state)
{
	struct plan_fixture *f = *state;
	struct rmoe_topology t = f->t;
	struct rmoe_plan_request req = {0};
	struct rmoe_plan plan;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_false(plan.have_layer);
	assert_int_equal(plan.nranks, 8);
	assert_int_equal(plan.node_crossings, 2);
	rmoe_plan_free(&plan);
	assert_int_equal(rmoe_plan_make(NULL, &t, &plan), RMOE_EINVAL);
}

/* The fit check compares the layer's modelled peak with the smallest
 * device memory over the ranks, and names that rank; unknown memory
 * (0) takes no part. */
static void test_planner_plan_fit_names_the_tightest_rank(void **state)
{
	struct plan_fixture *f = *state;
	struct rmoe_topology t = f->t;
	struct rmoe_layer_config cfg = f->cfg;
	struct rmoe_device_info dev[4];
	memset(dev, 0, sizeof(dev));
	const int64_t GiB = (int64_t)1 << 30;
	for (int r = 0; r < 4; r++) {
		dev[r].kind = RMOE_DEVICE_CUDA;
		dev[r].memory_bytes = 80 * GiB;
		snprintf(dev[r].source, sizeof(dev[r].source), "rank %d's probe", r);
	}
	dev[2].memory_bytes = 1 * GiB;
	dev[3].memory_bytes = 0;
	struct rmoe_plan_request req = {.layer = &cfg, .devices = dev};
	struct rmoe_plan plan;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.device.rank, 2);
	assert_int_equal(plan.device.kind, RMOE_DEVICE_CUDA);
	assert_true(plan.memory.run.peak > 1 * GiB);
	assert_int_equal(plan.fit_rc, RMOE_ENOMEM);
	assert_non_null(strstr(plan.fit_msg, "but rank 2 has 1.00 GiB (rank 2's probe)"));
	rmoe_plan_free(&plan);
	dev[2].memory_bytes = 80 * GiB;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.fit_rc, 0);
	rmoe_plan_free(&plan);
	for (int r = 0; r < 4; r++)
		dev[r].memory_bytes = 0;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.fit_rc, 0);
	assert_int_equal(plan.device.memory_bytes, 0);
	rmoe_plan_free(&plan);
}

/* Under a memory cap the plan chunks the ring's hops so that the modelled
 * peak of the worst routing stays within the cap; a cap below one row's
 * needs is a verdict, not a failure to plan. */
static void test_planner_plan_chunks_under_a_cap(void **state)
{
	struct plan_fixture *f = *state;
	struct rmoe_topology t = f->t;
	struct rmoe_layer_config cfg = f->cfg;
	cfg.dispatch = RMOE_DISPATCH_RING_EXPERT;
	struct rmoe_plan_request req = {.layer = &cfg};
	struct rmoe_plan plan;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	const int64_t whole = plan.memory.run.peak;
	rmoe_plan_free(&plan);
	cfg.mem_cap = whole * 3 / 4;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.cap_rc, 0);
	assert_true(plan.chunk_rows > 0 && plan.chunk_rows < cfg.tokens * cfg.topk);
	assert_true(plan.memory.run.peak <= cfg.mem_cap);
	struct rmoe_mem_config worst;
	struct rmoe_mem_estimate e;
	rmoe_mem_config_from_layer(&worst, &cfg, 4);
	worst.skew = 4;
	worst.chunk_rows = plan.chunk_rows;
	assert_int_equal(rmoe_memory_model(RMOE_DISPATCH_RING_EXPERT, &worst, &e), 0);
	assert_true(e.peak <= cfg.mem_cap);
	worst.chunk_rows = plan.chunk_rows + 1;
	assert_int_equal(rmoe_memory_model(RMOE_DISPATCH_RING_EXPERT, &worst, &e), 0);
	assert_true(e.peak > cfg.mem_cap - cfg.mem_cap / RMOE_CAP_HEADROOM);
	/* Every dispatcher is planned under the same cap: the ring's chunk as
	 * the run's, a2a's its own (a block's rows), each modelled within the
	 * cap at the worst routing; a2a-megatron takes none. */
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++) {
		enum rmoe_dispatch d = rmoe_dispatchers[i].kind;
		if (d == RMOE_DISPATCH_ALLTOALL_MEGATRON || d == RMOE_DISPATCH_ALLTOALL_DEEPEP) {
			assert_int_equal(plan.memory.cap_rc[i], RMOE_ENOTSUP);
			continue;
		}
		if (plan.memory.cap_rc[i] == RMOE_EINVAL)
			continue; /* a ring of tokens may need more than the expert ring's peak */
		assert_int_equal(plan.memory.cap_rc[i], 0);
		assert_true(plan.memory.cap_chunk_rows[i] > 0);
		if (d == RMOE_DISPATCH_RING_EXPERT)
			assert_int_equal(plan.memory.cap_chunk_rows[i], plan.chunk_rows);
		worst.chunk_rows = plan.memory.cap_chunk_rows[i];
		assert_int_equal(rmoe_memory_model(d, &worst, &e), 0);
		assert_true(e.peak <= cfg.mem_cap);
	}
	assert_int_equal(plan.memory.cap_rc[2], 0); /* a2a (rmoe_dispatchers' order) */
	rmoe_plan_free(&plan);
	cfg.mem_cap = 1024;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.cap_rc, RMOE_EINVAL);
	assert_non_null(strstr(plan.cap_msg, "memory cap 1024 bytes is too small"));
	rmoe_plan_free(&plan);
}

/* The bound (and peak) of row i as auto weighs it: the striped ring's
 * where the plan stripes the rings. */
static const struct rmoe_time_bound *auto_bound(const struct rmoe_plan *plan, int i, int striped)
{
	int k = rmoe_dispatchers[i].kind == RMOE_DISPATCH_RING_TOKEN;
	return striped && rmoe_dispatchers[i].striped ? &plan->time.striped[k] : &plan->time.est[i];
}

/* Issue 42: auto runs the smallest time bound among the dispatchers that
 * may run the layer, ties going to the smaller peak. */
static void test_planner_plan_auto_takes_the_fastest_that_fits(void **state)
{
	struct plan_fixture *f = *state;
	struct rmoe_topology t = f->t;
	struct rmoe_layer_config cfg = f->cfg;
	struct rmoe_plan_request req = {.layer = &cfg};
	struct rmoe_plan plan;
	/* 8 ranks on two nodes: the ring with 4 stripes, bounded pass by pass
	 * (forward its wire, 11.05 ms over 9.34 ms of compute; backward its
	 * compute, 24.87 ms over 23.64 ms of wire): 35.92 ms against
	 * a2a-deepep's 112.9; every bound it passed over is larger. */
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.dispatch, RMOE_DISPATCH_RING_EXPERT);
	assert_int_equal(plan.auto_row, 0);
	assert_true(plan.auto_striped);
	assert_int_equal(plan.stripe_count[3], 4);
	assert_non_null(strstr(plan.dispatch_reason, "ring striped: the smallest time bound that fits, 35.92 ms"));
	for (int i = 1; i < RMOE_PLAN_NDISPATCHERS; i++)
		assert_true(auto_bound(&plan, i, 1)->bound_s > plan.auto_bound_s);
	rmoe_plan_free(&plan);
	/* The flat ring (--stripes 1) is wire-bound on one adapter a node:
	 * a2a-deepep's bound is the smaller, and nothing is striped. */
	cfg.stripes = 1;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.dispatch, RMOE_DISPATCH_ALLTOALL_DEEPEP);
	assert_false(plan.auto_striped);
	for (int i = 0; i < 8; i++)
		assert_int_equal(plan.stripe_count[i], 1);
	assert_true(plan.time.est[4].bound_s < plan.time.est[0].bound_s);
	const int64_t deepep_peak = plan.memory.est[4].peak;
	rmoe_plan_free(&plan);
	/* a2a-deepep sends whole blocks: asked for chunks, or under a cap it
	 * does not take, or on a device its peak does not fit, auto passes it
	 * over for the next bound, the flat ring's (below a2a's). */
	cfg.chunk_rows = 4096;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.dispatch, RMOE_DISPATCH_RING_EXPERT);
	assert_non_null(strstr(plan.dispatch_reason, "a2a-deepep 112.9 (whole blocks, not chunks)"));
	rmoe_plan_free(&plan);
	cfg.chunk_rows = 0;
	cfg.mem_cap = deepep_peak;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.dispatch, RMOE_DISPATCH_RING_EXPERT);
	assert_int_equal(plan.cap_rc, 0);
	assert_non_null(strstr(plan.dispatch_reason, "a2a-deepep 112.9 (over the cap)"));
	rmoe_plan_free(&plan);
	cfg.mem_cap = 0;
	struct rmoe_device_info dev[8];
	memset(dev, 0, sizeof(dev));
	for (int r = 0; r < 8; r++) {
		dev[r].kind = RMOE_DEVICE_CUDA;
		dev[r].memory_bytes = deepep_peak - 1;
	}
	req.devices = dev;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.dispatch, RMOE_DISPATCH_RING_EXPERT);
	assert_int_equal(plan.fit_rc, 0);
	assert_non_null(strstr(plan.dispatch_reason, "a2a-deepep 112.9 (over the device)"));
	rmoe_plan_free(&plan);
	/* Partitions are ring hops: the rings only. */
	req.devices = NULL;
	cfg.partitions = 2;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(rmoe_dispatcher_of(plan.dispatch)->family, RMOE_FAMILY_RING);
	rmoe_plan_free(&plan);
	/* Nothing fits: the ring, whose fit check says why. */
	cfg.partitions = 0;
	for (int r = 0; r < 8; r++)
		dev[r].memory_bytes = (int64_t)1 << 20;
	req.devices = dev;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_int_equal(plan.dispatch, RMOE_DISPATCH_RING_EXPERT);
	assert_int_equal(plan.auto_row, -1);
	assert_int_equal(plan.fit_rc, RMOE_ENOMEM);
	assert_non_null(strstr(plan.dispatch_reason, "no dispatcher fits"));
	rmoe_plan_free(&plan);
}

/* One node, NVLink between every pair, a layer small enough that every
 * dispatcher's wire hides under its compute: the bounds are the same
 * compute, a tie, and the smallest peak runs. */
static void test_planner_plan_auto_breaks_ties_by_peak(void **state)
{
	struct plan_fixture *f = *state;
	struct rmoe_topology t = f->t;
	struct rmoe_layer_config cfg = f->cfg;
	cfg.tokens = 512;
	cfg.topk = 2;
	struct rmoe_plan_request req = {.layer = &cfg};
	struct rmoe_plan plan;
	assert_int_equal(rmoe_plan_make(&req, &t, &plan), 0);
	assert_true(plan.auto_row >= 0);
	int tied = 0;
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++) {
		const struct rmoe_time_bound *b = auto_bound(&plan, i, plan.auto_striped);
		if (b->bound_s > plan.time.est[plan.auto_row].bound_s * (1.0 + RMOE_AUTO_TIE) * (1.0 + RMOE_AUTO_TIE))
			continue;
		tied++;
		assert_true(plan.memory.est[plan.auto_row].peak <= plan.memory.est[i].peak);
	}
	assert_true(tied >= 2);
	rmoe_plan_free(&plan);
}

RMOE_TEST_MAIN(NULL, NULL,
               cmocka_unit_test_setup_teardown(test_planner_plan_for_a_simulated_cluster, plan_setup_8, plan_teardown),
               cmocka_unit_test_setup_teardown(test_planner_plan_of_the_ring_only, plan_setup_8, plan_teardown),
               cmocka_unit_test_setup_teardown(test_planner_plan_fit_names_the_tightest_rank, plan_setup_4,
                                               plan_teardown),
               cmocka_unit_test_setup_teardown(test_planner_plan_chunks_under_a_cap, plan_setup_4, plan_teardown),
               cmocka_unit_test_setup_teardown(test_planner_plan_auto_takes_the_fastest_that_fits, plan_setup_8,
                                               plan_teardown),
               cmocka_unit_test_setup_teardown(test_planner_plan_auto_breaks_ties_by_peak, plan_setup_4, plan_teardown))
