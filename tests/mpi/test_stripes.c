/* Multi-rank: the striped rings (graph/pass/stripes.c), expert and token
 * routing. The ranks are grouped into nodes of R consecutive ranks (the
 * first argument), so the planned ring crosses between nodes once per node
 * and each crossing hop goes in R stripes, relayed by the node's other
 * ranks. For even and skewed routing, f32 and bf16, with chunks and a
 * third window slot, without overlap, and (token routing) with token
 * counts that differ between ranks: the striped layer against the
 * reference, the same layer with the flat ring (stripes 1) bit for bit
 * (the pieces change how the bytes travel, not the arithmetic), and the
 * stripes it planned. Run under mpiexec -n N with N a multiple of R and at
 * least 2R. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "messages.h"
#include "problem.h"
#include "results.h"

static int failures;

static void expect(int ok, const char *what)
{
	rmoe_app_say("  %-72s %s\n", what, ok ? "ok" : "FAIL");
	if (!ok)
		failures++;
}

struct scenario {
	const char *name;
	enum rmoe_dispatch dispatch;
	enum rmoe_dtype dtype;
	int64_t hot;          /* skewed router: experts [0, hot) take nearly every token; 0: even */
	int64_t chunk_rows;
	int window, overlap;
	int uneven;           /* rank r holds 48 - 5r tokens (rank 0 the most) */
};

/* One run of cfg with s stripes requested: 0, the planned stripes, the
 * error against the reference. */
static int run(rmoe_ctx *ctx, struct rmoe_layer_config cfg, const struct rmoe_problem *prob, int s, int *planned,
               struct rmoe_results *res, double *err)
{
	cfg.stripes = s;
	rmoe_layer *layer = NULL;
	int rc = rmoe_app_agree(rmoe_layer_create(&layer, ctx, &cfg));
	if (!rc) {
		*planned = rmoe_layer_stripes(layer);
		rmoe_layer_destroy(layer);
		rc = rmoe_problem_run(ctx, &cfg, prob, res, NULL);
	}
	if (!rc) {
		const char *worst;
		int64_t ties;
		*err = rmoe_results_check(res, prob, &worst, &ties);
	}
	return rc;
}

static void run_scenario(rmoe_ctx *ctx, int nranks, int per_node, const struct scenario *s)
{
	struct rmoe_layer_config cfg;
	rmoe_app_layer_shape(&cfg, 32, 16, 2 * nranks, 2, 48);
	cfg.dispatch = s->dispatch;
	cfg.dtype = s->dtype;
	cfg.chunk_rows = s->chunk_rows;
	cfg.window = s->window;
	cfg.overlap = s->overlap;
	cfg.deterministic = 1;
	struct rmoe_problem prob;
	int64_t counts[64];
	for (int r = 0; r < nranks && r < 64; r++)
		counts[r] = s->uneven ? 48 - 5 * r : 48;
	if (rmoe_problem_init_tokens(&prob, &cfg, s->uneven ? counts : NULL, 23 + (uint64_t)nranks, NULL)) {
		expect(0, "problem init");
		return;
	}
	if (s->hot)
		rmoe_test_skew_router(&prob, s->hot);
	const double tolerance = s->dtype == RMOE_DTYPE_BF16 ? 1e-2 : 1e-5;
	struct rmoe_results striped, flat;
	memset(&striped, 0, sizeof(striped));
	memset(&flat, 0, sizeof(flat));
	int planned = 0, planned_flat = 0;
	double err = 1, err_flat = 1;
	char what[200];
	int rc = run(ctx, cfg, &prob, 0, &planned, &striped, &err);
	snprintf(what, sizeof(what), "%s %s: %d stripes planned (%d ranks a node), error %.2e",
	         rmoe_dispatch_name(s->dispatch), s->name, planned, per_node, err);
	expect(rc == 0 && planned == per_node && err <= tolerance, what);
	int rc_flat = run(ctx, cfg, &prob, 1, &planned_flat, &flat, &err_flat);
	if (!rc && !rc_flat) {
		const char *worst = "";
		double diff = rmoe_results_max_rel_diff(&striped, &flat, &prob, &worst);
		snprintf(what, sizeof(what), "%s %s: the flat ring (%d stripe) bit for bit (worst %s %.1e)",
		         rmoe_dispatch_name(s->dispatch), s->name, planned_flat, worst, diff);
		expect(planned_flat == 1 && diff == 0, what);
	} else {
		expect(0, rc ? rmoe_strerror(rc) : rmoe_strerror(rc_flat));
	}
	rmoe_results_free(&striped);
	rmoe_results_free(&flat);
	rmoe_problem_free(&prob);
}

int main(int argc, char **argv)
{
	const int per_node = argc > 1 ? atoi(argv[1]) : 2;
	int nranks;
	rmoe_ctx *ctx = rmoe_test_start_nodes(&argc, &argv, &nranks, per_node);
	if (per_node < 2 || nranks % per_node || nranks < 2 * per_node)
		return rmoe_test_skip(ctx, "test_stripes", "expected a multiple of the ranks a node, two nodes at least");
	rmoe_app_say("test_stripes on %d rank(s), %d a node\n", nranks, per_node);
	const enum rmoe_dispatch ring = RMOE_DISPATCH_RING_EXPERT, token = RMOE_DISPATCH_RING_TOKEN;
	const enum rmoe_dtype f32 = RMOE_DTYPE_F32, bf16 = RMOE_DTYPE_BF16;
	const struct scenario scenarios[] = {
		{"f32, even", ring, f32, 0, 0, 0, 1, 0},
		{"f32, skewed", ring, f32, 2, 0, 0, 1, 0},
		{"bf16, even", ring, bf16, 0, 0, 0, 1, 0},
		{"bf16, skewed", ring, bf16, 2, 0, 0, 1, 0},
		{"f32, chunks of 7 rows, window 3", ring, f32, 0, 7, 3, 1, 0},
		{"f32, no overlap", ring, f32, 0, 0, 0, 0, 0},
		{"f32, even", token, f32, 0, 0, 0, 1, 0},
		{"f32, skewed", token, f32, 2, 0, 0, 1, 0},
		{"bf16, even", token, bf16, 0, 0, 0, 1, 0},
		{"bf16, skewed", token, bf16, 2, 0, 0, 1, 0},
		{"f32, uneven counts, chunks of 7 rows", token, f32, 0, 7, 3, 1, 1},
		{"f32, no overlap", token, f32, 0, 0, 0, 0, 0},
	};
	for (unsigned i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
		run_scenario(ctx, nranks, per_node, &scenarios[i]);
	/* More stripes than a node has ranks: as many as it has. */
	struct rmoe_layer_config cfg;
	rmoe_app_layer_shape(&cfg, 32, 16, 2 * nranks, 2, 48);
	cfg.stripes = 16;
	rmoe_layer *layer = NULL;
	int rc = rmoe_app_agree(rmoe_layer_create(&layer, ctx, &cfg));
	char what[160];
	snprintf(what, sizeof(what), "16 stripes asked: %d, a node's ranks", rc ? -1 : rmoe_layer_stripes(layer));
	expect(rc == 0 && rmoe_layer_stripes(layer) == per_node, what);
	rmoe_layer_destroy(layer);
	/* Stripes are the rings': an all-to-all refuses more than one. */
	cfg.dispatch = RMOE_DISPATCH_ALLTOALL;
	cfg.stripes = 2;
	layer = NULL;
	rc = rmoe_layer_create(&layer, ctx, &cfg);
	int mine = rc == RMOE_ENOTSUP && !layer && strstr(rmoe_strerror(rc), "stripes = 2"), all = 0;
	MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	expect(all, "a2a with 2 stripes: refused on every rank, naming the value");
	return rmoe_test_end(ctx, "test_stripes", failures);
}
