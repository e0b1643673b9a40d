/* The multi-rank tests' start, end and uneven routing (harness.h). */
#include <mpi.h>
#include <stdlib.h>

#include "harness.h"
#include "messages.h"

rmoe_ctx *rmoe_test_start(int *argc, char ***argv, int *nranks)
{
	return rmoe_test_start_nodes(argc, argv, nranks, 0);
}

rmoe_ctx *rmoe_test_start_nodes(int *argc, char ***argv, int *nranks, int ranks_per_node)
{
	int provided;
	MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
	MPI_Comm_size(MPI_COMM_WORLD, nranks);
	rmoe_ctx *ctx = NULL;
	struct rmoe_ctx_config cfg;
	rmoe_ctx_config_init(&cfg);
	cfg.ranks_per_node = ranks_per_node;
	int rc = rmoe_ctx_create(&ctx, &cfg);
	if (rc)
		rmoe_app_error("rmoe_ctx_create failed: %s\n", rmoe_strerror(rc));
	if ((rc = rmoe_app_agree(rc))) {
		rmoe_app_say(rc == RMOE_ENOTSUP ? "skipped: this machine has no worker of the kinds asked for\n"
		                                : "FAILED: no context, so nothing was tested\n");
		MPI_Finalize();
		exit(rc == RMOE_ENOTSUP ? RMOE_TEST_SKIPPED : 1);
	}
	return ctx;
}

int rmoe_test_end(rmoe_ctx *ctx, const char *name, int failures)
{
	rmoe_ctx_destroy(ctx);
	int total = failures;
	MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (total)
		rmoe_app_say("%s: FAILED (%d failure(s))\n", name, total);
	else
		rmoe_app_say("%s: passed\n", name);
	MPI_Finalize();
	return total ? 1 : 0;
}

int rmoe_test_skip(rmoe_ctx *ctx, const char *name, const char *why)
{
	rmoe_ctx_destroy(ctx);
	rmoe_app_say("%s: skipped: %s\n", name, why);
	MPI_Finalize();
	return RMOE_TEST_SKIPPED;
}

void rmoe_test_skew_router(struct rmoe_problem *p, int64_t hot)
{
	const int64_t H = p->cfg.hidden, E = p->cfg.experts;
	for (int64_t h = 0; h < H; h++)
		for (int64_t e = 0; e < E; e++)
			p->w_router[h * E + e] *= e < hot ? 8.0f : 0.05f;
}
