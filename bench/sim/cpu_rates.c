/* One core's rates for the CPU cost model of the simulation
 * (codelets/sim_cost.c: RMOE_SIM_CPU_GFLOPS, RMOE_SIM_CPU_GBS), measured as
 * the layer's kernels see them: OpenBLAS sgemm, one thread, at the expert
 * GEMM shapes of a layer (rows per expert M = tokens*topk/experts, the
 * SwiGLU up/gate GEMM [M x H] x [H x 2F] and the down GEMM [M x F] x [F x H]),
 * and a row gather (the dispatch and combine kernels) over a [T x H] matrix.
 *
 *   cpu_rates H F E K T      prints "gflops=G gbs=B"
 *
 * Each figure is the best of 5 timed rounds of at least 0.2 s. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/sgemm_list.h"

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: cpu_rates H F E K T\n");
		return 2;
	}
	long H = atol(argv[1]), F = atol(argv[2]), E = atol(argv[3]), K = atol(argv[4]), T = atol(argv[5]);
	if (H < 1 || F < 1 || E < 1 || K < 1 || T < 1) {
		fprintf(stderr, "cpu_rates: H F E K T must be positive\n");
		return 2;
	}
#ifdef OPENBLAS_VERSION
	openblas_set_num_threads(1);
#endif
	long M = T * K / E;
	if (M < 1)
		M = 1;
	float *x = bench_filled((size_t)M * H), *w1 = bench_filled((size_t)H * 2 * F);
	float *h = bench_filled((size_t)M * 2 * F), *w2 = bench_filled((size_t)F * H), *y = bench_filled((size_t)M * H);
	const struct bench_gemm expert[] = {{0, 0, (int)M, (int)(2 * F), (int)H, x, w1, h, 0.0f},
	                                    {0, 0, (int)M, (int)H, (int)F, h, w2, y, 0.0f}};
	const double flops = bench_gemm_flops(expert, 2);
	double secs[5], best = 0;
	bench_gemm_time(expert, 2, 5, 0.2, secs);
	for (int round = 0; round < 5; round++)
		if (flops / secs[round] > best)
			best = flops / secs[round];
	/* Row gather: M*K/... rows picked from a [T x H] source, as dispatch does. */
	float *src = bench_filled((size_t)T * H), *dst = bench_filled((size_t)T * H);
	long *idx = malloc(sizeof(long) * (size_t)T);
	for (long i = 0; i < T; i++)
		idx[i] = (i * 7919) % T;
	double best_b = 0;
	for (int round = 0; round < 5; round++) {
		long n = 0;
		double t0 = bench_now(), t;
		do {
			for (long i = 0; i < T; i++)
				memcpy(dst + (size_t)i * H, src + (size_t)idx[i] * H, sizeof(float) * (size_t)H);
			n++;
		} while ((t = bench_now() - t0) < 0.2);
		double r = 2.0 * sizeof(float) * (double)T * H * n / t;   /* read + write */
		if (r > best_b)
			best_b = r;
	}
	volatile float sink = y[0] + dst[0] + h[0];
	(void)sink;
	printf("gflops=%.3f gbs=%.3f rows_per_expert=%ld\n", best / 1e9, best_b / 1e9, M);
	free(x), free(w1), free(h), free(w2), free(y), free(src), free(dst), free(idx);
	return 0;
}
