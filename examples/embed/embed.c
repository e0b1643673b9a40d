/* An application that owns MPI and uses a relaymoe layer as one part of its
 * own computation: it initialises MPI itself, hands its communicator to
 * relaymoe, runs the layer with the ring and with all-to-all, and checks that
 * both give the same output and input gradient. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include <relaymoe/relaymoe.h>
#include <relaymoe/relaymoe_mpi.h>

/* The application's own deterministic weights (the same on every rank). */
static float draw(unsigned long long *s)
{
	*s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
	return (float)((*s >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static int run(rmoe_ctx *ctx, enum rmoe_dispatch d, const float *x, const float *dy, float *y, float *dx)
{
	struct rmoe_layer_config cfg;
	rmoe_layer_config_init(&cfg);
	cfg.hidden = 64;
	cfg.ffn = 32;
	cfg.experts = 8;
	cfg.topk = 2;
	cfg.tokens = 96;
	cfg.dispatch = d;
	rmoe_layer *layer;
	int rc = rmoe_layer_create(&layer, ctx, &cfg);
	if (rc) {
		fprintf(stderr, "embed: %s\n", rmoe_strerror(rc));
		return rc;
	}
	unsigned long long s = 42;
	float *w = malloc(sizeof(float) * 64 * 8);
	for (int i = 0; i < 64 * 8; i++)
		w[i] = draw(&s) * 0.125f;
	rc = rmoe_layer_set_router(layer, w);
	free(w);
	int64_t first, count;
	rmoe_layer_owned_experts(layer, &first, &count);
	float *g = malloc(sizeof(float) * 64 * 32), *u = malloc(sizeof(float) * 64 * 32),
	      *dn = malloc(sizeof(float) * 64 * 32);
	for (int64_t e = 0; e < 8; e++) {
		for (int i = 0; i < 64 * 32; i++) {
			g[i] = draw(&s) * 0.125f;
			u[i] = draw(&s) * 0.125f;
			dn[i] = draw(&s) * 0.18f;
		}
		if (e >= first && e < first + count && !rc)
			rc = rmoe_layer_set_expert(layer, e, g, u, dn);
	}
	free(g);
	free(u);
	free(dn);
	if (!rc)
		rc = rmoe_layer_forward(layer, x, y);
	if (!rc)
		rc = rmoe_layer_backward(layer, dy, dx);
	if (rc)
		fprintf(stderr, "embed: %s\n", rmoe_strerror(rc));
	rmoe_layer_destroy(layer);
	return rc;
}

int main(int argc, char **argv)
{
	int provided, rank, size;
	MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);

	rmoe_ctx *ctx;
	int rc = rmoe_ctx_create_comm(&ctx, NULL, MPI_COMM_WORLD);
	if (rc) {
		fprintf(stderr, "embed: %s\n", rmoe_strerror(rc));
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	const int n = 96 * 64;
	float *x = malloc(sizeof(float) * n), *dy = malloc(sizeof(float) * n);
	float *y[2], *dx[2];
	unsigned long long s = 1000 + (unsigned long long)rank;
	for (int i = 0; i < n; i++) {
		x[i] = draw(&s);
		dy[i] = draw(&s);
	}
	for (int k = 0; k < 2; k++) {
		y[k] = malloc(sizeof(float) * n);
		dx[k] = malloc(sizeof(float) * n);
	}
	rc = run(ctx, RMOE_DISPATCH_RING_EXPERT, x, dy, y[0], dx[0]);
	if (!rc)
		rc = run(ctx, RMOE_DISPATCH_ALLTOALL, x, dy, y[1], dx[1]);

	/* The application's own MPI traffic goes on beside relaymoe's. */
	double local[3] = {0, 0, 0}, total[3];
	for (int i = 0; i < n && !rc; i++) {
		local[0] += (double)(y[0][i] - y[1][i]) * (y[0][i] - y[1][i]) +
		            (double)(dx[0][i] - dx[1][i]) * (dx[0][i] - dx[1][i]);
		local[1] += (double)y[1][i] * y[1][i] + (double)dx[1][i] * dx[1][i];
		local[2] += fabs(y[0][i]);
	}
	MPI_Allreduce(local, total, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	double rel = sqrt(total[0] / total[1]);
	int ok = !rc && total[2] > 0 && rel <= 1e-5;
	if (rank == 0)
		printf("embed: %d ranks, ring vs all-to-all relative difference %.2e: %s\n", size, rel,
		       ok ? "ok" : "FAILED");
	rmoe_ctx_destroy(ctx);
	for (int k = 0; k < 2; k++) {
		free(y[k]);
		free(dx[k]);
	}
	free(x);
	free(dy);
	MPI_Finalize();
	return ok ? 0 : 1;
}
