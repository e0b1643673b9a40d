/* The context respects what the application started.
 *   test_ctx starpu      the application runs StarPU-MPI itself; relaymoe uses
 *                        it, runs a layer, and leaves it running on destroy
 *   test_ctx serialized  MPI initialised with MPI_THREAD_SERIALIZED: a clear
 *                        error on every rank, MPI left to the application
 *   test_ctx library     relaymoe initialises and finalises MPI itself */
#include <mpi.h>
#include <starpu.h>
#include <starpu_mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relaymoe/relaymoe.h"
#include "relaymoe/relaymoe_mpi.h"

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
	float x[48], y[48], dx[48], w[8 * 64];
	for (int i = 0; i < 48; i++)
		x[i] = (float)((i * 37 + 11) % 17) / 17.0f - 0.5f;
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
		rc = rmoe_layer_backward(layer, x, dx);
	double s = 0;
	for (int i = 0; i < 48; i++)
		s += (double)y[i] * y[i];
	if (!rc && !(s > 0))
		rc = -100;
	rmoe_layer_destroy(layer);
	return rc;
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
			MPI_Finalize();
			return 77;
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
