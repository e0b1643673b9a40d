/* Multi-rank: what the layer's memory accounting measured (the peak of the
 * StarPU data a pass held, sampled at every task) shows the all-to-all
 * holding its top-k-expanded rows while the ring holds one hop's, and
 * chunking lowering the ring's measured peak by the rows it removes; the
 * buffers the graphs asked for agree (largest temporary). */
#include <stdio.h>

#include "app.h"

static int failures;

static void expect(int ok, const char *what, double got, double bound)
{
	rmoe_app_say("  %-58s %10.0f vs %10.0f bytes: %s\n", what, got, bound, ok ? "ok" : "FAIL");
	if (!ok)
		failures++;
}

static int run(rmoe_ctx *ctx, struct rmoe_layer_config cfg, const struct rmoe_problem *prob,
               struct rmoe_layer_stats *st)
{
	struct rmoe_results res;
	int rc = rmoe_problem_run(ctx, &cfg, prob, &res, st);
	rmoe_results_free(&res);
	return rc;
}

static double max_ranks(double v)
{
	double m;
	MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	return m;
}

int main(int argc, char **argv)
{
	int provided, nranks;
	MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	if (nranks < 2) {
		/* One rank is one hop holding every pair: nothing to show. */
		MPI_Finalize();
		return 77;
	}
	rmoe_ctx *ctx = NULL;
	int crc = rmoe_ctx_create(&ctx, NULL);
	if (crc)
		rmoe_app_error("rmoe_ctx_create failed: %s\n", rmoe_strerror(crc));
	if (rmoe_app_agree(crc)) {
		MPI_Finalize();
		return 1;
	}
	struct rmoe_layer_config cfg;
	rmoe_app_layer_shape(&cfg, 64, 16, 8 * nranks, 4, 512);
	struct rmoe_problem prob;
	if (rmoe_problem_init(&prob, &cfg, 3, NULL))
		return 1;
	const double tkh = 4.0 * (double)(cfg.tokens * cfg.topk * cfg.hidden);

	struct rmoe_layer_stats ring, a2a, chunked;
	cfg.dispatch = RMOE_DISPATCH_RING_EXPERT;
	int rc = run(ctx, cfg, &prob, &ring);
	cfg.dispatch = RMOE_DISPATCH_ALLTOALL;
	if (!rc)
		rc = run(ctx, cfg, &prob, &a2a);
	cfg.dispatch = RMOE_DISPATCH_RING_EXPERT;
	cfg.chunk_rows = 64;
	if (!rc)
		rc = run(ctx, cfg, &prob, &chunked);
	if (rc) {
		rmoe_app_error("%s", rmoe_strerror(rc));
		return 1;
	}
	rmoe_app_say("test_memory on %d ranks: T*K*H float32 = %.0f bytes\n", nranks, tkh);
	double ring_temp = max_ranks((double)ring.largest_temporary_bytes);
	double a2a_temp = max_ranks((double)a2a.largest_temporary_bytes);
	double ring_peak = max_ranks((double)(ring.peak_backward_bytes > ring.peak_forward_bytes
	                                              ? ring.peak_backward_bytes
	                                              : ring.peak_forward_bytes));
	double a2a_peak = max_ranks((double)(a2a.peak_backward_bytes > a2a.peak_forward_bytes
	                                             ? a2a.peak_backward_bytes
	                                             : a2a.peak_forward_bytes));
	/* Measured: the execution peak, above what lives across calls. */
	double ring_exec = ring_peak - max_ranks((double)ring.resident_bytes);
	double a2a_exec = a2a_peak - max_ranks((double)a2a.resident_bytes);
	double chunked_exec = max_ranks((double)(chunked.peak_backward_bytes > chunked.peak_forward_bytes
	                                                 ? chunked.peak_backward_bytes
	                                                 : chunked.peak_forward_bytes)) -
	                      max_ranks((double)chunked.resident_bytes);
	/* The all-to-all's dispatch permutes every pair's row: T*K*H at once. */
	expect(a2a_exec >= tkh, "a2a: measured execution peak >= T*K*H floats", a2a_exec, tkh);
	expect(ring_exec < a2a_exec, "ring: measured execution peak below the a2a's", ring_exec, a2a_exec);
	/* A backward hop holds gathered x, dy and a [rows, 4F] workspace per
	 * row: 64-row chunks instead of about T*K/N rows remove the rest. */
	double per_row = 4.0 * (2 * cfg.hidden + 4 * cfg.ffn);
	double removed = per_row * ((double)(cfg.tokens * cfg.topk) / nranks - 64);
	expect(ring_exec - chunked_exec >= 0.9 * removed, "ring, 64-row chunks: measured peak lower by the rows removed",
	       ring_exec - chunked_exec, 0.9 * removed);
	expect(ring_temp < tkh, "ring: largest buffer < T*K*H elements", ring_temp, tkh);
	/* even routing: a hop holds about T*K/N rows */
	expect(ring_temp <= 1.25 * tkh / nranks, "ring: largest buffer about T*K*H/N (even routing)",
	       ring_temp, 1.25 * tkh / nranks);
	expect(a2a_temp > ring_temp, "a2a: largest buffer larger than the ring's", a2a_temp, ring_temp);
	expect(a2a_peak > ring_peak, "a2a: peak layer memory above the ring's", a2a_peak, ring_peak);
	double chunk_bound = 4.0 * 64 * (cfg.hidden > 4 * cfg.ffn ? cfg.hidden : 4 * cfg.ffn);
	double weights = 4.0 * 3 * cfg.hidden * cfg.ffn * (cfg.experts / nranks);
	double chunk_temp = max_ranks((double)chunked.largest_temporary_bytes);
	expect(chunk_temp <= (chunk_bound > weights ? chunk_bound : weights),
	       "ring, 64-row chunks: largest buffer <= max(chunk, partition)", chunk_temp,
	       chunk_bound > weights ? chunk_bound : weights);
	rmoe_problem_free(&prob);
	return rmoe_app_test_end(ctx, "test_memory", failures);
}
