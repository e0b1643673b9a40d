/* The context's MPI: as the application left it, or started here; the
 * communicator its transfers ride and the ranks sharing its node. */
#include <starpu.h>
#include <starpu_mpi.h>

#include "rmoe_codelets.h"
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

#ifndef STARPU_SIMGRID
/* A StarPU-MPI request's structures, for the bookkeeping term
 * (codelets/probe/bookkeeping.c): receives and then sends of one-value vectors
 * from and to this rank itself, on tags of the context's window before any
 * pass has one, each measured as the heap's growth while they are posted. */
int rmoe_requests_measure(rmoe_ctx *ctx)
{
	enum { COUNT = 32 };
	static float values[COUNT];
	starpu_data_handle_t src[COUNT], dst[COUNT];
	starpu_mpi_req rreq[COUNT], sreq[COUNT];
	int64_t base;
	int rc = rmoe_tags_reserve(ctx, COUNT, &base);
	if (rc)
		return rc;
	for (int i = 0; i < COUNT; i++) {
		values[i] = (float)i;
		starpu_vector_data_register(&src[i], STARPU_MAIN_RAM, (uintptr_t)&values[i], 1, sizeof(float));
		starpu_vector_data_register(&dst[i], -1, 0, 1, sizeof(float));
	}
	int nr = 0, ns = 0;
	int64_t before = rmoe_heap_current();
	while (nr < COUNT && starpu_mpi_irecv(dst[nr], &rreq[nr], ctx->rank, base + nr, ctx->comm) == 0)
		nr++;
	int64_t posted = rmoe_heap_current();
	while (ns < nr && starpu_mpi_isend(src[ns], &sreq[ns], ctx->rank, base + ns, ctx->comm) == 0)
		ns++;
	int64_t sent = rmoe_heap_current();
	if (nr > 0 && ns > 0)
		rmoe_bookkeeping_set_requests((sent - posted) / ns, (posted - before) / nr);
	MPI_Status st;
	for (int i = 0; i < ns; i++)
		starpu_mpi_wait(&sreq[i], &st);
	/* A receive without its send would never end: each has its send. */
	for (int i = 0; i < ns; i++)
		starpu_mpi_wait(&rreq[i], &st);
	if (ns < nr)
		rc = rmoe_error(RMOE_ESTARPU, "starpu_mpi_isend to this rank itself failed measuring its requests");
	else if (nr < COUNT)
		rc = rmoe_error(RMOE_ESTARPU, "starpu_mpi_irecv from this rank itself failed measuring its requests");
	/* Submitted, not waited for: a receive left without its send (a
	 * failed isend) would hold its handle forever. */
	for (int i = 0; i < COUNT; i++) {
		starpu_data_unregister_submit(src[i]);
		starpu_data_unregister_submit(dst[i]);
	}
	/* The window starts again at its first tag, so the first pass's block
	 * decodes as the first (scripts/trace). */
	rmoe_tags_init(ctx);
	return rc;
}
#else
int rmoe_requests_measure(rmoe_ctx *ctx)
{
	(void)ctx;
	return 0;
}
#endif
