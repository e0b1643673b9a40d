/* What the CPU GEMM-rate programs share (bench/sim/cpu_rates.c,
 * bench/rate/sgemm_rate.c): a list of row-major OpenBLAS sgemm calls on the
 * program's buffers, run and timed as one unit, and its flop count.
 * Header-only: bench/sim/check_real.sh compiles cpu_rates.c on its own. */
#ifndef RMOE_BENCH_SGEMM_LIST_H
#define RMOE_BENCH_SGEMM_LIST_H

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* C[m x n] = A B + beta C, A [m x k] (ta: stored [k x m]), B [k x n]
 * (tb: stored [n x k]), every matrix contiguous (leading dimension its
 * row length), as the layer's kernels call them (codelets/kernels/). */
struct bench_gemm {
	int ta, tb;
	int m, n, k;
	const float *a, *b;
	float *c;
	float beta;
};

static inline double bench_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* n floats in [-0.5, 0.5), never zeros (a zero operand could take a
 * shortcut); exits when memory runs out. */
static inline float *bench_filled(size_t n)
{
	float *p = malloc(n * sizeof(float));
	if (!p) {
		fprintf(stderr, "out of memory for %zu floats\n", n);
		exit(1);
	}
	for (size_t i = 0; i < n; i++)
		p[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.4995f;
	return p;
}

static inline void bench_gemm_run(const struct bench_gemm *g, int n)
{
	for (int i = 0; i < n; i++, g++)
		if (g->m > 0 && g->n > 0 && g->k > 0)
			cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
			            g->m, g->n, g->k, 1.0f, g->a, g->ta ? g->m : g->k, g->b, g->tb ? g->k : g->n, g->beta,
			            g->c, g->n);
}

static inline double bench_gemm_flops(const struct bench_gemm *g, int n)
{
	double f = 0;
	for (int i = 0; i < n; i++)
		f += 2.0 * g[i].m * (double)g[i].n * g[i].k;
	return f;
}

/* rounds timed rounds, each running the list until at least min_s has
 * passed: the seconds of one list in each round into secs[]. */
static inline void bench_gemm_time(const struct bench_gemm *g, int n, int rounds, double min_s, double *secs)
{
	for (int r = 0; r < rounds; r++) {
		long times = 0;
		double t0 = bench_now(), t;
		do {
			bench_gemm_run(g, n);
			times++;
		} while ((t = bench_now() - t0) < min_s);
		secs[r] = t / times;
	}
}

#endif
