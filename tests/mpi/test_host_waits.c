/* Multi-rank: where a pass's dispatch graph makes the host wait
 * (rmoe_layer_stats.host_waits_*). The all-to-alls need every peer's
 * expert counts on the host to size their buffers, once per layer call, in
 * the forward (one wait per peer), and nothing else: the backward reuses
 * the forward's plan (the same routing), and the row exchanges are
 * StarPU-MPI requests ordered by data dependencies, so no host round trip
 * separates a rank's arriving rows from its expert GEMMs, as with
 * Megatron's all-to-all queued on the GPU stream. Token
 * routing waits for the same counts (it sizes the visiting partitions'
 * rows with them), expert routing with overlap never waits; without
 * overlap (the paper's naive ablation) it waits at every hop, which shows
 * the count sees host waits. */
#include <mpi.h>
#include <stdio.h>

#include "harness.h"
#include "messages.h"
#include "problem.h"
#include "results.h"

static int failures;

static void expect_waits(const char *what, int got, int lo, int hi)
{
	int ok = got >= lo && got <= hi;
	if (lo == hi)
		rmoe_app_say("  %-62s %3d, expected %d: %s\n", what, got, lo, ok ? "ok" : "FAIL");
	else
		rmoe_app_say("  %-62s %3d, expected at least %d: %s\n", what, got, lo, ok ? "ok" : "FAIL");
	if (!ok)
		failures++;
}

/* The host waits of one layer's forward and backward, the largest over the
 * ranks (one rank waiting is enough to fail). */
static int run(rmoe_ctx *ctx, struct rmoe_layer_config cfg, const struct rmoe_problem *prob, int *fwd, int *bwd)
{
	struct rmoe_results res;
	struct rmoe_layer_stats st;
	int rc = rmoe_problem_run(ctx, &cfg, prob, &res, &st);
	rmoe_results_free(&res);
	if (rc) {
		rmoe_app_error("%s: %s", rmoe_dispatch_name(cfg.dispatch), rmoe_strerror(rc));
		return rc;
	}
	int mine[2] = {st.host_waits_forward, st.host_waits_backward}, most[2];
	MPI_Allreduce(mine, most, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	*fwd = most[0];
	*bwd = most[1];
	return 0;
}

struct scenario {
	const char *name;
	int64_t shared_ffn, skew_hot;
	double wait_timeout;
};

static void run_scenario(rmoe_ctx *ctx, int nranks, const struct scenario *s)
{
	struct rmoe_layer_config cfg;
	rmoe_app_layer_shape(&cfg, 64, 32, 4 * nranks, 2, 256);
	cfg.shared_ffn = s->shared_ffn;
	cfg.wait_timeout = s->wait_timeout;
	struct rmoe_problem prob;
	if (rmoe_problem_init(&prob, &cfg, 11, NULL)) {
		failures++;
		return;
	}
	if (s->skew_hot)
		rmoe_test_skew_router(&prob, s->skew_hot);
	rmoe_app_say(" %s\n", s->name);
	const int counts = nranks - 1;
	char what[128];
	int fwd, bwd;
	/* Every all-to-all: the lean one's backward sends x, dy and g out and
	 * dx and dg back, chunk by chunk; Megatron's recomputes, then runs the
	 * reverse path; DeepEP's sends its peer counts in the same exchange as
	 * the expert counts. Chunked, a2a waits no more. */
	const enum rmoe_dispatch a2as[] = {RMOE_DISPATCH_ALLTOALL, RMOE_DISPATCH_ALLTOALL_MEGATRON,
	                                   RMOE_DISPATCH_ALLTOALL_DEEPEP};
	for (int i = 0; i < 3; i++) {
		const char *name = rmoe_dispatch_name(a2as[i]);
		cfg.dispatch = a2as[i];
		if (run(ctx, cfg, &prob, &fwd, &bwd) != 0) {
			failures++;
			continue;
		}
		snprintf(what, sizeof(what), "%s forward: the expert counts only (%d peer(s))", name, counts);
		expect_waits(what, fwd, counts, counts);
		snprintf(what, sizeof(what), "%s backward: none (the forward's counts)", name);
		expect_waits(what, bwd, 0, 0);
	}
	cfg.dispatch = RMOE_DISPATCH_ALLTOALL;
	cfg.chunk_rows = 7;
	if (run(ctx, cfg, &prob, &fwd, &bwd) == 0) {
		expect_waits("a2a in 7-row chunks, forward: the expert counts only", fwd, counts, counts);
		expect_waits("a2a in 7-row chunks, backward: none", bwd, 0, 0);
	} else
		failures++;
	cfg.chunk_rows = 0;
	cfg.dispatch = RMOE_DISPATCH_RING_TOKEN;
	if (run(ctx, cfg, &prob, &fwd, &bwd) == 0) {
		expect_waits("token forward: the counts only", fwd, counts, counts);
		expect_waits("token backward: the counts only", bwd, counts, counts);
	} else
		failures++;
	cfg.dispatch = RMOE_DISPATCH_RING_EXPERT;
	if (run(ctx, cfg, &prob, &fwd, &bwd) == 0)
		expect_waits("ring forward and backward: none", fwd + bwd, 0, 0);
	else
		failures++;
	cfg.overlap = 0;
	if (run(ctx, cfg, &prob, &fwd, &bwd) == 0) {
		expect_waits("ring without overlap, forward: at every hop but the last", fwd, counts, 1 << 20);
		expect_waits("ring without overlap, backward: at every hop but the last", bwd, counts, 1 << 20);
	} else
		failures++;
	rmoe_problem_free(&prob);
}

int main(int argc, char **argv)
{
	int nranks;
	/* Never NULL: a context that cannot be made fails the test there. */
	rmoe_ctx *ctx = rmoe_test_start(&argc, &argv, &nranks);
	if (nranks < 2)
		return rmoe_test_skip(ctx, "test_host_waits", "one rank exchanges nothing");
	rmoe_app_say("test_host_waits on %d ranks (most over the ranks)\n", nranks);
	const struct scenario scenarios[] = {
		{"even routing", 0, 0, 0},
		{"shared expert, wait_timeout 60 s (polled waits)", 24, 0, 60},
		{"skewed: rank 0's experts take nearly every token", 0, 4, 0},
	};
	for (unsigned i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
		run_scenario(ctx, nranks, &scenarios[i]);
	return rmoe_test_end(ctx, "test_host_waits", failures);
}
