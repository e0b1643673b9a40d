/* Multi-rank: ring expert routing, ring token routing and the all-to-all
 * baselines, forward and backward, against the single-process reference, on seeded inputs, for
 * several routing situations. Run under mpiexec -n N (N = 1..4). */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "messages.h"
#include "problem.h"
#include "results.h"
#include "seeded.h"

/* fp32 against a double reference: relative norm error. */
#define TOLERANCE 1e-5

static int failures;

static void expect(int ok, const char *what, double value)
{
	if (!ok) {
		rmoe_app_say("FAIL %s (%.3e)\n", what, value);
		failures++;
	}
}

struct scenario {
	const char *name;
	int64_t hidden, ffn, experts_per_rank, topk, tokens, shared_ffn, chunk_rows;
	int norm_topk, skew, overlap;
	int shared_gated;         /* Qwen2-MoE's gate on the shared expert */
};

static void run_scenario(rmoe_ctx *ctx, const struct scenario *s)
{
	int nranks;
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	struct rmoe_layer_config cfg;
	const int64_t experts = s->experts_per_rank * nranks;
	rmoe_app_layer_shape(&cfg, s->hidden, s->ffn, experts, s->topk < 0 ? experts : s->topk, s->tokens);
	cfg.shared_ffn = s->shared_ffn;
	cfg.shared_gated = s->shared_gated;
	cfg.chunk_rows = s->chunk_rows;
	cfg.norm_topk = s->norm_topk;
	cfg.overlap = s->overlap;

	struct rmoe_problem prob;
	if (rmoe_problem_init(&prob, &cfg, 7 + (uint64_t)s->tokens, NULL)) {
		expect(0, "problem init", 0);
		return;
	}
	if (s->skew)
		rmoe_test_skew_router(&prob, s->skew);

	/* Every all-to-all: the lean one, Megatron's, DeepEP's (whole blocks:
	 * no chunks). */
	enum { ND = 5 };
	enum rmoe_dispatch ds[ND] = {RMOE_DISPATCH_RING_EXPERT, RMOE_DISPATCH_ALLTOALL, RMOE_DISPATCH_RING_TOKEN,
	                             RMOE_DISPATCH_ALLTOALL_MEGATRON, RMOE_DISPATCH_ALLTOALL_DEEPEP};
	struct rmoe_results res[ND];
	for (int i = 0; i < ND; i++) {
		char what[160];
		cfg.dispatch = ds[i];
		cfg.chunk_rows = ds[i] == RMOE_DISPATCH_ALLTOALL_DEEPEP ? 0 : s->chunk_rows;
		rmoe_layer *layer = NULL;
		int rc = rmoe_app_agree(rmoe_layer_create(&layer, ctx, &cfg));
		if (!rc)
			rc = rmoe_app_agree(rmoe_problem_apply(&prob, layer));
		if (!rc)
			rc = rmoe_app_agree(rmoe_results_alloc(&res[i], &prob));
		/* Two calls: the second reuses tags, buffers and the saved state. */
		for (int it = 0; it < 2 && !rc; it++) {
			rc = rmoe_layer_forward(layer, prob.x, res[i].y);
			if (!rc)
				rc = rmoe_layer_backward(layer, prob.dy, res[i].dx);
			rc = rmoe_app_agree(rc);
		}
		if (!rc)
			rc = rmoe_app_agree(rmoe_results_collect(&res[i], &prob, layer));
		snprintf(what, sizeof(what), "%s/%s: layer calls (%s)", s->name, rmoe_dispatch_name(ds[i]),
		         rc ? rmoe_strerror(rc) : "ok");
		expect(rc == 0, what, 0);
		if (!rc) {
			const char *worst;
			int64_t ties;
			double err = rmoe_results_check(&res[i], &prob, &worst, &ties);
			snprintf(what, sizeof(what), "%s/%s vs reference (worst %s)", s->name,
			         rmoe_dispatch_name(ds[i]), worst);
			expect(err <= TOLERANCE, what, err);
			rmoe_app_say("  %-28s %-12s rel err %.2e (%s), near ties %lld\n", s->name,
			             rmoe_dispatch_name(ds[i]), err, worst, (long long)ties);
		}
		rmoe_layer_destroy(layer);
	}
	for (int i = 1; i < ND; i++) {
		const char *worst;
		double diff = rmoe_results_max_rel_diff(&res[0], &res[i], &prob, &worst);
		char what[160];
		snprintf(what, sizeof(what), "%s: ring vs %s (worst %s)", s->name, rmoe_dispatch_name(ds[i]),
		         worst);
		expect(diff <= TOLERANCE, what, diff);
	}
	for (int i = 0; i < ND; i++)
		rmoe_results_free(&res[i]);
	rmoe_problem_free(&prob);
}

int main(int argc, char **argv)
{
	int nranks;
	/* Never NULL: a context that cannot be made fails the test there. */
	rmoe_ctx *ctx = rmoe_test_start(&argc, &argv, &nranks);
	rmoe_app_say("test_layer on %d rank(s)\n", nranks);
	const struct scenario scenarios[] = {
		/* name, H, F, E/rank, K, T, shared, chunk, norm, skew, overlap, gated */
		{"even, norm top-k", 24, 16, 3, 3, 37, 0, 0, 1, 0, 1, 0},
		{"no renormalisation", 24, 16, 3, 2, 29, 0, 0, 0, 0, 1, 0},
		{"K=1", 16, 8, 2, 1, 33, 0, 0, 1, 0, 1, 0},
		{"K=E", 16, 8, 2, -1, 11, 0, 0, 1, 0, 1, 0},
		{"skewed: idle experts", 24, 16, 3, 2, 41, 0, 0, 1, 2, 1, 0},
		{"all tokens on one expert", 16, 12, 2, 1, 23, 0, 0, 1, 1, 1, 0},
		{"shared expert", 24, 16, 2, 2, 19, 20, 0, 1, 0, 1, 0},
		{"gated shared expert, chunks, skewed", 24, 16, 2, 2, 19, 20, 4, 0, 2, 1, 1},
		{"chunks of 5 rows", 24, 16, 3, 3, 37, 0, 5, 1, 0, 1, 0},
		{"no overlap", 24, 16, 3, 3, 21, 0, 0, 1, 0, 0, 0},
	};
	for (unsigned i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
		run_scenario(ctx, &scenarios[i]);
	return rmoe_test_end(ctx, "test_layer", failures);
}
