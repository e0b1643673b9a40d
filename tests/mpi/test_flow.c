/* Multi-rank: the rings' flow control holds the heap to the memory model
 * when one rank is slow. Rank 1's expert tasks sleep (the test hook
 * RMOE_TEST_EXPERT_DELAY_US), so its left neighbour could run ahead and
 * send hops whose receive buffers are still in use: StarPU-MPI would keep
 * them outside StarPU's accounting (early data) and the heap figure would
 * exceed the model by about a partition per hop ahead. With the credits of
 * graph/pass/flow.c it may not (the all-to-alls': their receivers' credits,
 * alltoall_plan.c). Both rings (with --all the all-to-alls too),
 * forward and backward, on even routing and on a router skewed to a few hot
 * experts; outputs checked against the double-precision reference (ring)
 * and against the ring (others).
 *   test_flow [--window W] [--delay-us US] [--tokens T] [--all] [--no-credits]
 *             [--ranks-per-node R]
 * (W: rmoe_layer_config.window; T tokens per rank, default 1024; R: the
 * ranks grouped into nodes of R, so expert routing's node-crossing hops go
 * in stripes relayed by the nodes' ranks, whose pieces the model holds).
 * --no-credits is the check's control: the rings with their credits off
 * (RMOE_FLOW_CREDITS=off), even routing only; it passes only when the
 * heap of some pass exceeds the model by more than the tolerance (the
 * early data the credits exist to prevent) while the outputs stay right,
 * so it shows that the check above can fail. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "messages.h"
#include "problem.h"
#include "results.h"
#include "rmoe_memory_model.h"

/* The heap figure against the model of the data plus the runtime's
 * structures of the pass's graph (rmoe_layer_stats.runtime_*_bytes: its
 * handles, tasks and requests): within 5%, either side; what neither
 * counts (codelet scratch, MPI's buffers) shows here. */
#define HEAP_TOLERANCE 0.05
/* fp32 sums in another order than the reference's double precision. */
#define OUTPUT_TOLERANCE 1e-5

static int failures;
/* --no-credits: the largest heap-over-model excess seen, and no failure
 * for an excess (it is what the control looks for). */
static int control;
/* --ranks-per-node: the stripes expert routing must plan (a node's ranks). */
static int want_stripes = 1;
static double max_excess = -1.0;

static double max_ranks(double v)
{
	double m;
	MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	return m;
}

/* From the model of the data less what may be gone before the peak (a2a's
 * rows leaving, the token blocks' inputs the network may take first:
 * rmoe_mem_estimate.leaving_*; the structures of tasks already ended) to
 * the model with the runtime's structures. model includes runtime. */
static void expect_near(const char *what, double heap, double model, double leaving, double runtime)
{
	double dev = heap / model - 1.0;
	int ok = heap <= (1 + HEAP_TOLERANCE) * model && heap >= (1 - HEAP_TOLERANCE) * (model - leaving - runtime);
	if (dev > max_excess)
		max_excess = dev;
	rmoe_app_say("  %-34s heap %8.2f MiB, model %8.2f MiB (heap %+5.1f%%", what, heap / 1048576.0, model / 1048576.0,
	             100.0 * dev);
	rmoe_app_say(", runtime %.2f MiB", runtime / 1048576.0);
	if (leaving > 0)
		rmoe_app_say(", %+5.1f%% of the model less %.2f MiB leaving", 100.0 * (heap / (model - leaving) - 1.0),
		             leaving / 1048576.0);
	rmoe_app_say("): %s\n", ok ? "ok" : control ? "above (the control expects it)" : "FAIL");
	if (!ok && !control)
		failures++;
}

/* Two forward and backward passes of cfg: the first warms the runtimes up
 * (StarPU-MPI's and Open MPI's structures for each peer, made at its first
 * message: a striped ring's first pass meets its relays, 2.3 MiB more heap
 * at 8 ranks once), the second is measured; its heap peaks, max over ranks,
 * into heap[2],
 * the model's for the routing seen plus the runtime's structures into
 * model[2], those structures into runtime[2]; the outputs into res. */
static int measure(rmoe_ctx *ctx, const struct rmoe_layer_config *cfg, const struct rmoe_problem *prob,
                   struct rmoe_results *res, double heap[2], double model[2], double leaving[2], double runtime[2])
{
	rmoe_layer *layer = NULL;
	struct rmoe_layer_stats st;
	double hf = 0, hb = 0, rf = 0, rb = 0;
	int stripes = 1;
	int rc = rmoe_app_agree(rmoe_layer_create(&layer, ctx, cfg));
	if (!rc) {
		stripes = rmoe_layer_stripes(layer);
		const int ring = cfg->dispatch == RMOE_DISPATCH_RING_EXPERT || cfg->dispatch == RMOE_DISPATCH_RING_TOKEN;
		const int want = ring ? want_stripes : 1;
		if (stripes != want) {
			rmoe_app_error("%s: %d stripes planned, expected %d", rmoe_dispatch_name(cfg->dispatch), stripes, want);
			failures++;
		}
	}
	if (!rc)
		rc = rmoe_app_agree(rmoe_problem_apply(prob, layer));
	if (!rc)
		rc = rmoe_app_agree(rmoe_results_alloc(res, prob));
	for (int pass = 0; pass < 2 && !rc; pass++) {
		rc = rmoe_app_agree(rmoe_layer_forward(layer, prob->x, res->y));
		if (!rc)
			rc = rmoe_app_agree(rmoe_layer_backward(layer, prob->dy, res->dx));
		if (!rc && pass == 1) {
			rmoe_layer_get_stats(layer, &st);
			hf = (double)st.peak_heap_forward_bytes;
			hb = (double)st.peak_heap_backward_bytes;
			rf = (double)st.runtime_forward_bytes;
			rb = (double)st.runtime_backward_bytes;
		}
	}
	if (!rc)
		rc = rmoe_app_agree(rmoe_results_collect(res, prob, layer));
	rmoe_layer_destroy(layer);
	if (rc)
		return rc;
	double ring, a2a;
	rmoe_problem_routing_skew(prob, res->topk_idx, &ring, &a2a);
	struct rmoe_mem_config mc;
	struct rmoe_mem_estimate e;
	rmoe_mem_config_from_layer(&mc, cfg, prob->nranks);
	mc.chunk_rows = st.chunk_rows;
	mc.stripes = stripes;
	mc.skew = cfg->dispatch == RMOE_DISPATCH_ALLTOALL_MEGATRON ? a2a : ring;
	/* a2a: each rank's own blocks, as relaymoe run models them */
	const int blocked = cfg->dispatch == RMOE_DISPATCH_ALLTOALL || cfg->dispatch == RMOE_DISPATCH_ALLTOALL_DEEPEP;
	int64_t *blocks = blocked ? rmoe_problem_a2a_blocks(prob, res->topk_idx) : NULL;
	mc.blocks = blocks;
	mc.block_tokens = blocks ? blocks + prob->nranks * prob->nranks : NULL;
	rc = rmoe_memory_model(cfg->dispatch, &mc, &e);
	free(blocks);
	if (rc)
		return rc;
	heap[0] = max_ranks(hf);
	heap[1] = max_ranks(hb);
	runtime[0] = max_ranks(rf);
	runtime[1] = max_ranks(rb);
	/* Every pass submits tasks, handles and transfers: a term of 0 would
	 * mean the counts or the measured sizes are lost. */
	if (runtime[0] <= 0 || runtime[1] <= 0) {
		rmoe_app_error("%s: the runtime's structures of a pass are %.0f / %.0f bytes: not counted",
		               rmoe_dispatch_name(cfg->dispatch), runtime[0], runtime[1]);
		failures++;
	}
	model[0] = (double)e.peak_forward + runtime[0];
	model[1] = (double)e.peak_backward + runtime[1];
	leaving[0] = (double)e.leaving_forward;
	leaving[1] = (double)e.leaving_backward;
	return 0;
}

static int run_case(rmoe_ctx *ctx, struct rmoe_layer_config cfg, const struct rmoe_problem *prob, const char *name,
                    int ndispatch)
{
	static const enum rmoe_dispatch which[] = {RMOE_DISPATCH_RING_EXPERT, RMOE_DISPATCH_RING_TOKEN,
	                                           RMOE_DISPATCH_ALLTOALL, RMOE_DISPATCH_ALLTOALL_MEGATRON,
	                                           RMOE_DISPATCH_ALLTOALL_DEEPEP};
	struct rmoe_results res[5];
	memset(res, 0, sizeof(res));
	int rc = 0;
	rmoe_app_say("%s routing:\n", name);
	for (int i = 0; i < ndispatch && !rc; i++) {
		cfg.dispatch = which[i];
		double heap[2], model[2], leaving[2], runtime[2];
		if ((rc = measure(ctx, &cfg, prob, &res[i], heap, model, leaving, runtime)))
			break;
		char what[64];
		snprintf(what, sizeof(what), "%s forward", rmoe_dispatch_name(which[i]));
		expect_near(what, heap[0], model[0], leaving[0], runtime[0]);
		snprintf(what, sizeof(what), "%s backward", rmoe_dispatch_name(which[i]));
		expect_near(what, heap[1], model[1], leaving[1], runtime[1]);
		const char *worst = "";
		int64_t ties = 0;
		double diff = i == 0 ? rmoe_results_check(&res[0], prob, &worst, &ties)
		                     : rmoe_results_max_rel_diff(&res[0], &res[i], prob, &worst);
		int ok = diff <= OUTPUT_TOLERANCE;
		rmoe_app_say("  %-34s %.2e (%s) against %s: %s\n", rmoe_dispatch_name(which[i]), diff, worst,
		             i == 0 ? "the reference" : "the ring", ok ? "ok" : "FAIL");
		if (!ok)
			failures++;
	}
	for (int i = 0; i < 5; i++)
		rmoe_results_free(&res[i]);
	return rc;
}

int main(int argc, char **argv)
{
	int window = 0, ndispatch = 2, per_node = 0;
	long delay_us = 100000, tokens = 1024;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--all"))
			ndispatch = 5;
		else if (!strcmp(argv[i], "--window") && i + 1 < argc)
			window = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--delay-us") && i + 1 < argc)
			delay_us = atol(argv[++i]);
		else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
			tokens = atol(argv[++i]);
		else if (!strcmp(argv[i], "--no-credits"))
			control = 1;
		else if (!strcmp(argv[i], "--ranks-per-node") && i + 1 < argc)
			want_stripes = per_node = atoi(argv[++i]);
		else {
			fprintf(stderr, "test_flow: unknown argument '%s'\n", argv[i]);
			return 2;
		}
	}
	int nranks, rank;
	MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &(int){0});
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (nranks < 3) {
		/* With two ranks a neighbour can be at most N - 2 = 0 hops ahead. */
		MPI_Finalize();
		return RMOE_TEST_SKIPPED;
	}
	/* Read at the first expert task of the process: before any. */
	if (rank == 1 && delay_us > 0) {
		char v[32];
		snprintf(v, sizeof(v), "%ld", delay_us);
		setenv("RMOE_TEST_EXPERT_DELAY_US", v, 1);
	}
	/* Every rank alike: the layer compares the switch across ranks. */
	if (control)
		setenv("RMOE_FLOW_CREDITS", "off", 1);
	rmoe_ctx *ctx = NULL;
	struct rmoe_ctx_config ccfg;
	rmoe_ctx_config_init(&ccfg);
	ccfg.ranks_per_node = per_node;
	if (rmoe_app_agree(rmoe_ctx_create(&ctx, &ccfg))) {
		MPI_Finalize();
		return RMOE_TEST_SKIPPED;
	}
	/* The default layer's widths (Qwen3-30B-A3B / 16), fewer tokens: a
	 * partition's weights (2.4 MiB at 4 ranks) are then a larger part of
	 * the peak, so one hop received early shows. */
	struct rmoe_layer_config cfg;
	rmoe_app_layer_shape(&cfg, 128, 48, 32 * nranks, 8, tokens);
	cfg.window = window;
	rmoe_app_say("test_flow on %d ranks%s, %ld tokens per rank, window %d%s, rank 1's expert tasks %ld us slower\n",
	             nranks, per_node ? " in nodes (striped)" : "", tokens, window ? window : 2,
	             control ? " without credits (the control)" : "", delay_us);
	struct rmoe_problem prob;
	int rc = rmoe_problem_init(&prob, &cfg, 11, NULL);
	if (!rc)
		rc = run_case(ctx, cfg, &prob, "even", ndispatch);
	/* Skewed: experts of a quarter of rank 0's partition take nearly every
	 * pair, so hops differ in size and the busiest hop sets the peak. */
	if (!rc && !control) {
		rmoe_test_skew_router(&prob, cfg.experts / nranks / 4);
		rc = run_case(ctx, cfg, &prob, "skewed", ndispatch);
	}
	rmoe_problem_free(&prob);
	if (!rc && control) {
		rmoe_app_say("control: the largest heap excess over the model %+.1f%%: %s\n", 100.0 * max_excess,
		             max_excess > HEAP_TOLERANCE ? "the check detects early data (ok)"
		                                         : "FAIL: without credits nothing exceeded the model");
		if (max_excess <= HEAP_TOLERANCE)
			failures++;
	}
	if (rc) {
		rmoe_app_error("%s", rmoe_strerror(rc));
		failures++;
	}
	return rmoe_test_end(ctx, "test_flow", failures);
}
