/* The context's MPI: as the application left it, or started here; the
 * communicator its transfers ride and the ranks sharing its node. */
#include <starpu.h>

#include "rmoe_ctx.h"

int rmoe_ctx_mpi(rmoe_ctx *ctx, MPI_Comm comm, int starpu_running)
{
	int flag = 0, provided = 0;
#ifdef STARPU_SIMGRID
	/* StarPU-MPI initialised SMPI before the application's main ran. */
	flag = 1;
#else
	MPI_Initialized(&flag);
#endif
	if (!flag) {
		/* The library makes a few MPI calls of its own (collective checks)
		 * while StarPU-MPI's progress thread runs: MULTIPLE is required. */
		if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
			return rmoe_error(RMOE_EMPI, "MPI_Init_thread failed");
		ctx->started_mpi = 1;
	} else {
		MPI_Query_thread(&provided);
	}
#ifdef STARPU_SIMGRID
	/* SMPI reports MPI_THREAD_SINGLE, yet its simulated threads never run
	 * at once (SimGrid schedules them one by one): any of them may call MPI. */
	provided = MPI_THREAD_MULTIPLE;
#endif
	if (provided < MPI_THREAD_MULTIPLE)
		return rmoe_error(RMOE_EMPI,
		                  "MPI provides thread level %d, but relaymoe needs MPI_THREAD_MULTIPLE (%d): its "
		                  "collective checks run beside StarPU-MPI's progress thread; initialise MPI with "
		                  "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)",
		                  provided, MPI_THREAD_MULTIPLE);
	ctx->comm = comm;
#ifndef STARPU_SIMGRID
	/* The application runs StarPU and, we assume, StarPU-MPI over comm:
	 * StarPU-MPI 1.3 listens only on the communicator it was started with,
	 * so that is the one every transfer must use. Otherwise our own
	 * communicator: our tags cannot meet the application's messages.
	 * (Under simulation StarPU-MPI over SMPI works on MPI_COMM_WORLD only;
	 * the tags keep to their window of it, tags.c.) */
	if (!starpu_running) {
		if (MPI_Comm_dup(comm, &ctx->comm) != MPI_SUCCESS)
			return rmoe_error(RMOE_EMPI, "MPI_Comm_dup failed");
		ctx->dup_comm = 1;
	}
#else
	(void)starpu_running;
#endif
	MPI_Comm_rank(ctx->comm, &ctx->rank);
	MPI_Comm_size(ctx->comm, &ctx->size);
	MPI_Comm_split_type(ctx->comm, MPI_COMM_TYPE_SHARED, ctx->rank, MPI_INFO_NULL, &ctx->node);
	MPI_Comm_rank(ctx->node, &ctx->local_rank);
	MPI_Comm_size(ctx->node, &ctx->local_size);
	return 0;
}
