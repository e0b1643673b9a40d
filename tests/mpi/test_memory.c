/* Multi-rank: what the layer's memory accounting measured (the peak of the
 * StarPU data a pass held, sampled at every task and every 0.5 ms) against
 * the memory model (scheduler/model/memory_model.c) for the routing the run saw,
 * every dispatcher, forward and backward; outputs and gradients against the
 * reference; chunking lowering the ring's measured peak by the rows it
 * removes, and the buffers the ring's graph asked for (largest temporary).
 * No dispatcher is compared with another: benchmarks report that. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "messages.h"
#include "problem.h"
#include "results.h"
#include "rmoe_memory_model.h"

/* fp32 against a double reference: relative norm error. */
#define TOLERANCE 1e-5
/* Measured against modelled dynamic bytes (the pass's peak less what lives
 * across calls): the model counts every buffer the graphs allocate, in the
 * order they live; what it misses is allocator rounding and StarPU counting
 * a buffer a little before or after its task. A missed buffer of a hop or a
 * stage is larger than this. */
#define MODEL_SLACK 0.05

static int failures;

static void expect(int ok, const char *what, double got, double bound)
{
	rmoe_app_say("  %-66s %10.0f vs %10.0f: %s\n", what, got, bound, ok ? "ok" : "FAIL");
	if (!ok)
		failures++;
}

static double max_ranks(double v)
{
	double m;
	MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	return m;
}

struct measured {
	double exec;       /* the larger pass's dynamic peak, max over ranks */
	double largest;    /* largest temporary */
	double chunk_rows;
};

/* Runs cfg: checks the results against the reference and the measured
 * dynamic peaks, forward and backward, against the model's. */
static int run(rmoe_ctx *ctx, struct rmoe_layer_config cfg, const struct rmoe_problem *prob, const char *label,
               struct measured *m)
{
	struct rmoe_results res;
	struct rmoe_layer_stats st;
	int rc = rmoe_problem_run(ctx, &cfg, prob, &res, &st);
	if (rc) {
		rmoe_app_error("%s: %s", label, rmoe_strerror(rc));
		rmoe_results_free(&res);
		failures++;
		return rc;
	}
	char what[160];
	const char *worst = "";
	int64_t ties;
	double err = rmoe_results_check(&res, prob, &worst, &ties);
	snprintf(what, sizeof(what), "%s: error against the reference (worst %s), bound", label, worst);
	rmoe_app_say("  %-66s %10.1e vs %10.1e: %s\n", what, err, TOLERANCE, err <= TOLERANCE ? "ok" : "FAIL");
	failures += !(err <= TOLERANCE);

	double hop, rank;
	rmoe_problem_routing_skew(prob, res.topk_idx, &hop, &rank);
	struct rmoe_mem_config mc;
	rmoe_mem_config_from_layer(&mc, &cfg, prob->nranks);
	mc.rank_tokens = prob->rank_tokens;
	mc.capacity = cfg.tokens;
	mc.chunk_rows = st.chunk_rows;
	mc.skew = cfg.dispatch == RMOE_DISPATCH_ALLTOALL_MEGATRON ? rank : hop;
	/* a2a: each rank's own blocks (the model's rmoe_mem_config.blocks) */
	const int blocked = cfg.dispatch == RMOE_DISPATCH_ALLTOALL || cfg.dispatch == RMOE_DISPATCH_ALLTOALL_DEEPEP;
	int64_t *blocks = blocked ? rmoe_problem_a2a_blocks(prob, res.topk_idx) : NULL;
	mc.blocks = blocks;
	mc.block_tokens = blocks ? blocks + prob->nranks * prob->nranks : NULL;
	struct rmoe_mem_estimate e;
	rc = rmoe_memory_model(cfg.dispatch, &mc, &e);
	free(blocks);
	if (rc) {
		rmoe_app_error("%s: %s", label, rmoe_strerror(rc));
		rmoe_results_free(&res);
		failures++;
		return rc;
	}
	/* The peaks less the model's resident part of each pass (the caller's y
	 * forward, dy and dx backward, as counted by the layer). With counts
	 * that differ, the ranks' resident parts differ too: the total peaks,
	 * the largest rank's against the model's largest. */
	int uneven = 0;
	for (int r = 1; r < prob->nranks; r++)
		uneven |= prob->rank_tokens[r] != prob->rank_tokens[0];
	const double base[2] = {uneven ? 0 : (double)e.resident_forward, uneven ? 0 : (double)e.resident_backward};
	const double fwd = max_ranks((double)st.peak_forward_bytes) - base[0];
	const double bwd = max_ranks((double)st.peak_backward_bytes) - base[1];
	const double model[2] = {(double)(uneven ? e.peak_forward : e.dynamic_forward),
	                         (double)(uneven ? e.peak_backward : e.dynamic_backward)};
	const double got[2] = {fwd, bwd};
	/* a2a: the rows still to leave for their experts may have left before
	 * the peak (the network's timing); the rest of the model is what the
	 * graph holds. */
	const double leaving[2] = {(double)e.leaving_forward, (double)e.leaving_backward};
	for (int p = 0; p < 2; p++) {
		const char *pass = p ? "backward" : "forward";
		if (leaving[p] > 0) {
			snprintf(what, sizeof(what), "%s %s: measured %s peak at most the model (+%.0f%%)", label, pass,
			         uneven ? "total" : "dynamic", 100 * MODEL_SLACK);
			expect(got[p] <= (1 + MODEL_SLACK) * model[p], what, got[p], model[p]);
			snprintf(what, sizeof(what), "%s %s: at least the model less the rows leaving (-%.0f%%)", label, pass,
			         100 * MODEL_SLACK);
			expect(got[p] >= (1 - MODEL_SLACK) * (model[p] - leaving[p]), what, got[p], model[p] - leaving[p]);
			continue;
		}
		snprintf(what, sizeof(what), "%s %s: measured %s peak within %.0f%% of the model", label, pass,
		         uneven ? "total" : "dynamic", 100 * MODEL_SLACK);
		expect(fabs(got[p] - model[p]) <= MODEL_SLACK * model[p], what, got[p], model[p]);
	}
	m->exec = fmax(fwd, bwd);
	m->largest = max_ranks((double)st.largest_temporary_bytes);
	m->chunk_rows = (double)st.chunk_rows;
	rmoe_results_free(&res);
	return 0;
}

/* Ranks with different token counts (rmoe_layer_set_tokens), rank 0 with
 * none, the layer's capacity the largest: every dispatcher's total peak
 * against the model with every rank's count (a2a's between the model less
 * its rows leaving and the model, as above). */
static void run_uneven(rmoe_ctx *ctx, int nranks)
{
	int64_t counts[64];
	for (int r = 0; r < nranks; r++)
		counts[r] = r == 0 ? 0 : 700 - 200 * (r - 1);
	struct rmoe_layer_config cfg;
	rmoe_app_layer_shape(&cfg, 64, 16, 8 * nranks, 4, 700);
	struct rmoe_problem prob;
	if (rmoe_problem_init_tokens(&prob, &cfg, counts, 5, NULL)) {
		failures++;
		return;
	}
	rmoe_app_say("uneven counts (0, 700, 500, ...):\n");
	const enum rmoe_dispatch all[] = {RMOE_DISPATCH_RING_EXPERT, RMOE_DISPATCH_RING_TOKEN, RMOE_DISPATCH_ALLTOALL,
	                                  RMOE_DISPATCH_ALLTOALL_MEGATRON, RMOE_DISPATCH_ALLTOALL_DEEPEP};
	struct measured m;
	for (unsigned i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		char label[64];
		snprintf(label, sizeof(label), "uneven %s", rmoe_dispatch_name(all[i]));
		cfg.dispatch = all[i];
		if (run(ctx, cfg, &prob, label, &m))
			break;
	}
	rmoe_problem_free(&prob);
}

int main(int argc, char **argv)
{
	int nranks;
	/* Never NULL: a context that cannot be made fails the test there. */
	rmoe_ctx *ctx = rmoe_test_start(&argc, &argv, &nranks);
	if (nranks < 2)
		return rmoe_test_skip(ctx, "test_memory", "one rank is one hop holding every pair");
	struct rmoe_layer_config cfg;
	rmoe_app_layer_shape(&cfg, 64, 16, 8 * nranks, 4, 512);
	struct rmoe_problem prob;
	if (rmoe_problem_init(&prob, &cfg, 3, NULL))
		return 1;
	rmoe_app_say("test_memory on %d ranks (bytes, max over the ranks)\n", nranks);

	struct measured ring, chunked, other;
	cfg.dispatch = RMOE_DISPATCH_RING_EXPERT;
	int rc = run(ctx, cfg, &prob, "ring", &ring);
	cfg.chunk_rows = 64;
	if (!rc)
		rc = run(ctx, cfg, &prob, "ring, 64-row chunks", &chunked);
	cfg.chunk_rows = 0;
	const enum rmoe_dispatch others[] = {RMOE_DISPATCH_RING_TOKEN, RMOE_DISPATCH_ALLTOALL,
	                                     RMOE_DISPATCH_ALLTOALL_MEGATRON, RMOE_DISPATCH_ALLTOALL_DEEPEP};
	for (unsigned i = 0; i < sizeof(others) / sizeof(others[0]) && !rc; i++) {
		cfg.dispatch = others[i];
		rc = run(ctx, cfg, &prob, rmoe_dispatch_name(others[i]), &other);
	}
	if (rc) {
		rmoe_problem_free(&prob);
		return rmoe_test_end(ctx, "test_memory", failures + 1);
	}
	const double tkh = 4.0 * (double)(cfg.tokens * cfg.topk * cfg.hidden);
	/* A backward hop holds gathered x, dy and a [rows, 4F] workspace per
	 * row: 64-row chunks instead of about T*K/N rows remove the rest. */
	double per_row = 4.0 * (2 * cfg.hidden + 4 * cfg.ffn);
	double removed = per_row * ((double)(cfg.tokens * cfg.topk) / nranks - 64);
	expect(ring.exec - chunked.exec >= 0.9 * removed, "ring, 64-row chunks: measured peak lower by the rows removed",
	       ring.exec - chunked.exec, 0.9 * removed);
	/* even routing: a hop holds about T*K/N rows */
	expect(ring.largest <= 1.25 * tkh / nranks, "ring: largest buffer about T*K*H/N (even routing)", ring.largest,
	       1.25 * tkh / nranks);
	double chunk_bound = 4.0 * 64 * (cfg.hidden > 4 * cfg.ffn ? cfg.hidden : 4 * cfg.ffn);
	double weights = 4.0 * 3 * cfg.hidden * cfg.ffn * (cfg.experts / nranks);
	expect(chunked.largest <= fmax(chunk_bound, weights), "ring, 64-row chunks: largest buffer <= max(chunk, partition)",
	       chunked.largest, fmax(chunk_bound, weights));
	rmoe_problem_free(&prob);
	run_uneven(ctx, nranks);
	return rmoe_test_end(ctx, "test_memory", failures);
}
