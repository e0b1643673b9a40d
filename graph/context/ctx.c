/* The context: MPI and StarPU(-MPI) for one process, the topology its
 * ranks share and the ring planned on it.
 *
 * Initialisation belongs to the application: MPI and StarPU are started here
 * only when the application has not started them, and rmoe_ctx_destroy stops
 * only what was started here. The steps have files of their own: MPI
 * (ctx_mpi.c), StarPU (ctx_starpu.c, with ctx_policy.c and ctx_bus.c), the
 * BLAS threads (ctx_blas.c), the ring (ctx_ring.c), the tags (tags.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <starpu.h>
#include <starpu_mpi.h>

#include "relaymoe/relaymoe_mpi.h"
#include "rmoe_codelets.h"
#include "rmoe_collective.h"
#include "rmoe_ctx.h"
#include "rmoe_system.h"

void rmoe_ctx_config_init(struct rmoe_ctx_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->ncpus = 0;
	cfg->ncuda = -1;
	cfg->sched = NULL;
	cfg->verbose = 0;
	cfg->cluster_file = NULL;
	cfg->trace = NULL;
}

int rmoe_ctx_ring_order(const rmoe_ctx *ctx, int *order)
{
	if (!ctx || !order)
		return rmoe_error(RMOE_EINVAL, "rmoe_ctx_ring_order: ctx and order must not be NULL");
	memcpy(order, ctx->ring, (size_t)ctx->size * sizeof(int));
	return 0;
}

int rmoe_ctx_rank(const rmoe_ctx *ctx)
{
	return ctx ? ctx->rank : -1;
}

int rmoe_ctx_size(const rmoe_ctx *ctx)
{
	return ctx ? ctx->size : -1;
}

/* Stops what the context started, in reverse; a trace is converted first
 * (StarPU's shutdown has written this rank's file). */
static int ctx_unwind(rmoe_ctx *ctx)
{
	if (ctx->codelets_started)
		rmoe_codelets_stop();
	if (ctx->started_starpu_mpi)
		starpu_mpi_shutdown();
	else if (starpu_is_initialized())
		starpu_task_wait_for_all();
	/* After the last task's callback. */
	int log_rc = rmoe_task_log_close(ctx->task_log);
	ctx->task_log = NULL;
	if (ctx->host_cache)
		rmoe_host_cache_uninstall();
	int rc = rmoe_trace_finish(ctx);
	if (ctx->node != MPI_COMM_NULL)
		MPI_Comm_free(&ctx->node);
	if (ctx->dup_comm)
		MPI_Comm_free(&ctx->comm);
	if (ctx->started_mpi)
		MPI_Finalize();
	rmoe_topology_free(&ctx->topo);
	free(ctx->ring);
	free(ctx);
	return rc ? rc : log_rc;
}

static int ctx_create(rmoe_ctx **out, const struct rmoe_ctx_config *ucfg, MPI_Comm comm)
{
	struct rmoe_ctx_config cfg;
	if (!out)
		return rmoe_error(RMOE_EINVAL, "rmoe_ctx_create: ctx pointer is NULL");
	*out = NULL;
	if (ucfg)
		cfg = *ucfg;
	else
		rmoe_ctx_config_init(&cfg);
	if (cfg.ncpus < 0)
		return rmoe_error(RMOE_EINVAL, "ctx ncpus = %d: expected 0 (automatic) or a positive count", cfg.ncpus);
	if (cfg.ranks_per_node < 0)
		return rmoe_error(RMOE_EINVAL, "ctx ranks_per_node = %d: expected 0 (by host) or a positive count",
		                  cfg.ranks_per_node);
	if (cfg.blas_threads < 0)
		return rmoe_error(RMOE_EINVAL, "ctx blas_threads = %d: expected 0 (automatic) or a positive count",
		                  cfg.blas_threads);
	if (cfg.ncuda < -1)
		return rmoe_error(RMOE_EINVAL, "ctx ncuda = %d: expected -1 (all), 0 or a positive count", cfg.ncuda);
	rmoe_ctx *ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return rmoe_error(RMOE_ENOMEM, "rmoe_ctx_create: out of host memory");
	ctx->verbose = cfg.verbose;
	ctx->node = MPI_COMM_NULL;
	const int starpu_running = starpu_is_initialized();
	/* A context is created with blocking waits: no layer, no timeout yet. */
	struct rmoe_wait w = rmoe_wait_make(0);
	int rc = rmoe_ctx_mpi(ctx, comm, starpu_running);
	if (!rc)
		rc = rmoe_agree(&w, ctx->comm, rmoe_trace_prepare(ctx, cfg.trace, starpu_running), "to set up the trace");
	if (!rc && !starpu_running)
		rc = rmoe_ctx_starpu(ctx, &cfg);
	if (rc) {
		/* A trace prepared on this rank was refused by another: no merge. */
		rmoe_trace_release(ctx);
		ctx_unwind(ctx);
		return rc;
	}
	if ((rc = rmoe_agree(&w, ctx->comm, rmoe_codelets_init(), "to set up the codelets"))) {
		rmoe_ctx_destroy(ctx);
		return rc;
	}
	rmoe_ctx_blas_setup(ctx, &cfg);
	rmoe_codelets_start();
	ctx->codelets_started = 1;
	if ((rc = rmoe_ctx_plan_ring(ctx, &w, &cfg))) {
		rmoe_ctx_destroy(ctx);
		return rc;
	}
	rmoe_tags_init(ctx);
	const char *log = rmoe_env(RMOE_ENV_TASK_LOG);
	if ((rc = rmoe_agree(&w, ctx->comm, log && *log ? rmoe_task_log_open(log, ctx->rank, &ctx->task_log) : 0,
	                     "to open the task log (RMOE_TASK_LOG)"))) {
		rmoe_ctx_destroy(ctx);
		return rc;
	}
	/* The runtime's structures a pass's graph will hold, measured once
	 * per process (codelets/probe/bookkeeping.c). */
	rc = rmoe_bookkeeping_measure();
	if (!rc)
		rc = rmoe_requests_measure(ctx);
	if ((rc = rmoe_agree(&w, ctx->comm, rc, "to measure the runtime's structures"))) {
		rmoe_ctx_destroy(ctx);
		return rc;
	}
	if (ctx->verbose && ctx->rank == 0) {
		int64_t handle, task, task_buffer, send, recv;
		rmoe_bookkeeping_units(&handle, &task, &task_buffer, &send, &recv);
		fprintf(stderr,
		        "relaymoe: the runtime's structures: %lld B a handle, %lld B a task and %lld B a task's "
		        "buffer, %lld B a send, %lld B a receive\n",
		        (long long)handle, (long long)task, (long long)task_buffer, (long long)send, (long long)recv);
	}
	*out = ctx;
	return 0;
}

int rmoe_ctx_create(rmoe_ctx **ctx, const struct rmoe_ctx_config *cfg)
{
	return ctx_create(ctx, cfg, MPI_COMM_WORLD);
}

int rmoe_ctx_create_fcomm(rmoe_ctx **ctx, const struct rmoe_ctx_config *cfg, int fortran_comm)
{
	int flag = 0;
	MPI_Initialized(&flag);
	if (!flag)
		return rmoe_error(RMOE_EMPI, "a Fortran communicator (%d) was given but MPI is not initialised",
		                  fortran_comm);
	return ctx_create(ctx, cfg, MPI_Comm_f2c((MPI_Fint)fortran_comm));
}

int rmoe_ctx_create_comm(rmoe_ctx **ctx, const struct rmoe_ctx_config *cfg, MPI_Comm comm)
{
	int flag = 0;
	MPI_Initialized(&flag);
	if (!flag)
		return rmoe_error(RMOE_EMPI, "a communicator was given but MPI is not initialised");
	return ctx_create(ctx, cfg, comm);
}

int rmoe_ctx_destroy(rmoe_ctx *ctx)
{
	if (!ctx)
		return 0;
	if (ctx->nlayers > 0)
		return rmoe_error(RMOE_ESTATE, "rmoe_ctx_destroy: %d layer(s) still alive; destroy them first",
		                  ctx->nlayers);
	return ctx_unwind(ctx);
}
