/* The context respects what the application started.
 *   test_ctx starpu      the application runs StarPU-MPI itself; relaymoe uses
 *                        it, runs a layer, and leaves it running on destroy
 *   test_ctx serialized  MPI initialised with MPI_THREAD_SERIALIZED: a clear
 *                        error on every rank, MPI left to the application
 *   test_ctx library     relaymoe initialises and finalises MPI itself */
#include <math.h>
#include <mpi.h>
#include <starpu.h>
#include <starpu_mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relaymoe/relaymoe.h"
#include "relaymoe/relaymoe_mpi.h"

/* Every expert of the tiny layer has the same weights, so whatever the
 * router picks, y = expert(x) (the top-k weights sum to 1), and the router's
 * gradient through the renormalised weights vanishes (every dg is equal):
 * dx is the expert's input gradient alone. Both are computed here in
 * double, independently of the library. fp32 against double over sums of
 * at most H = 8 or F = 4 terms: a few units of 2^-24. */
#define TINY_TOL 1e-5

static double silu_d(double a)
{
	return a / (1.0 + exp(-a));
}

/* y and dx of one token through one expert (w_gate, w_up [H][F], w_down
 * [F][H]) for the output gradient dy. */
static void expert_token(const float *w, const float *x, const float *dy, double *y, double *dx)
{
	enum { H = 8, F = 4 };
	const float *wg = w, *wu = w + 32, *wd = w + 64;
	double a[F], u[F], dact[F];
	for (int f = 0; f < F; f++) {
		a[f] = u[f] = dact[f] = 0;
		for (int h = 0; h < H; h++) {
			a[f] += (double)x[h] * wg[h * F + f];
			u[f] += (double)x[h] * wu[h * F + f];
			dact[f] += (double)dy[h] * wd[f * H + h];
		}
	}
	for (int h = 0; h < H; h++) {
		y[h] = dx[h] = 0;
		for (int f = 0; f < F; f++) {
			double s = 1.0 / (1.0 + exp(-a[f]));
			double dgate = dact[f] * u[f] * s * (1.0 + a[f] * (1.0 - s)), dup = dact[f] * silu_d(a[f]);
			y[h] += silu_d(a[f]) * u[f] * wd[f * H + h];
			dx[h] += dgate * wg[h * F + f] + dup * wu[h * F + f];
		}
	}
}

static double rel_err(const float *got, const double *want, int n)
{
	double num = 0, den = 0;
	for (int i = 0; i < n; i++) {
		num += (got[i] - want[i]) * (got[i] - want[i]);
		den += want[i] * want[i];
	}
	return sqrt(num) / (den > 0 ? sqrt(den) : 1e-300);
}

static int tiny_layer(rmoe_ctx *ctx)
{
	struct rmoe_layer_config cfg;
	rmoe_layer_config_init(&cfg);
	cfg.hidden = 8;
	cfg.ffn = 4;
	cfg.experts = 2 * rmoe_ctx_size(ctx);
	cfg.topk = 2;
	cfg.tokens = 6;
	rmoe_layer *layer;
	int rc = rmoe_layer_create(&layer, ctx, &cfg);
	if (rc)
		return rc;
	float x[48], y[48], dx[48], dy[48], w[8 * 64];
	for (int i = 0; i < 48; i++) {
		x[i] = (float)((i * 37 + 11) % 17) / 17.0f - 0.5f;
		dy[i] = (float)((i * 29 + 5) % 13) / 13.0f - 0.5f;
	}
	for (int i = 0; i < 8 * 64; i++)
		w[i] = (float)((i * 53 + 7) % 23) / 23.0f - 0.5f;
	rc = rmoe_layer_set_router(layer, w);
	int64_t first, count;
	rmoe_layer_owned_experts(layer, &first, &count);
	for (int64_t e = first; e < first + count && !rc; e++)
		rc = rmoe_layer_set_expert(layer, e, w, w + 32, w + 64);
	if (!rc)
		rc = rmoe_layer_forward(layer, x, y);
	if (!rc)
		rc = rmoe_layer_backward(layer, dy, dx);
	rmoe_layer_destroy(layer);
	if (rc)
		return rc;
	double want_y[48], want_dx[48];
	for (int t = 0; t < 6; t++)
		expert_token(w, x + 8 * t, dy + 8 * t, want_y + 8 * t, want_dx + 8 * t);
	double ey = rel_err(y, want_y, 48), edx = rel_err(dx, want_dx, 48);
	printf("tiny layer against the expert computed in double: y %.2e, dx %.2e (tolerance %.0e)\n", ey, edx,
	       TINY_TOL);
	return ey <= TINY_TOL && edx <= TINY_TOL ? 0 : -100;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "starpu";
	int provided, rank, ok = 1;
	if (strcmp(mode, "library") == 0) {
		rmoe_ctx *ctx;
		int rc = rmoe_ctx_create(&ctx, NULL);
		ok = rc == 0 && tiny_layer(ctx) == 0;
		if (rc == 0)
			rmoe_ctx_destroy(ctx);
		int fin = 0;
		MPI_Finalized(&fin);
		ok = ok && fin;
		printf("library-owned MPI: %s\n", ok ? "ok" : "FAILED");
		return ok ? 0 : 1;
	}
	int level = strcmp(mode, "serialized") == 0 ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE;
	MPI_Init_thread(&argc, &argv, level, &provided);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (strcmp(mode, "serialized") == 0) {
		rmoe_ctx *ctx = NULL;
		int rc = rmoe_ctx_create_comm(&ctx, NULL, MPI_COMM_WORLD);
		ok = rc == RMOE_EMPI && strstr(rmoe_strerror(rc), "MPI_THREAD_MULTIPLE") != NULL && !ctx;
		int fin = 1;
		MPI_Finalized(&fin);
		ok = ok && !fin;
		printf("rank %d: serialized MPI refused: %s (%s)\n", rank, ok ? "ok" : "FAILED", rmoe_strerror(rc));
	} else {
		struct starpu_conf conf;
		starpu_conf_init(&conf);
		conf.ncpus = 1;
		if (starpu_mpi_init_conf(NULL, NULL, 0, MPI_COMM_WORLD, &conf) != 0) {
			fprintf(stderr, "test_ctx: starpu_mpi_init_conf failed: nothing tested\n");
			MPI_Finalize();
			return 1;
		}
		rmoe_ctx *ctx;
		int rc = rmoe_ctx_create_comm(&ctx, NULL, MPI_COMM_WORLD);
		ok = rc == 0 && tiny_layer(ctx) == 0;
		if (rc == 0)
			rmoe_ctx_destroy(ctx);
		ok = ok && starpu_is_initialized();
		printf("rank %d: application-owned StarPU-MPI kept running: %s\n", rank, ok ? "ok" : "FAILED");
		starpu_mpi_shutdown();
	}
	int all;
	MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	MPI_Finalize();
	return all ? 0 : 1;
}
