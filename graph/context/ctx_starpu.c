/* StarPU and StarPU-MPI started on the context's communicator: the
 * workers, the policy, the host buffer cache installed before StarPU
 * allocates. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <starpu.h>
#include <starpu_mpi.h>

#include "rmoe_codelets.h"
#include "rmoe_ctx.h"
#include "rmoe_system.h"

/* CPU workers for this rank when the user did not say: the node's cores
 * shared among its ranks, one of each rank's share left to StarPU-MPI's
 * progress thread when the share has more than one core. */
static int auto_ncpus(int local_size)
{
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	if (cores < 1)
		cores = 1;
	long share = cores / (local_size > 0 ? local_size : 1);
	if (share >= 2)
		return (int)(share - 1);
	return 1;
}

int rmoe_ctx_starpu(rmoe_ctx *ctx, const struct rmoe_ctx_config *cfg)
{
	int rc = rmoe_ctx_check_policy(cfg);
	if (rc)
		return rc;
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	if (cfg->ncpus > 0)
		conf.ncpus = cfg->ncpus;
	else if (!getenv("STARPU_NCPU"))
		conf.ncpus = auto_ncpus(ctx->local_size);
	conf.ncuda = cfg->ncuda;
	if (cfg->sched)
		conf.sched_policy_name = cfg->sched;
	/* StarPU binds every rank's first worker to core 0 by default: with
	 * several ranks on a node they would all share one core. */
	if (ctx->local_size > 1)
		setenv("STARPU_WORKERS_NOBIND", "1", 0);
#ifndef STARPU_SIMGRID
	if ((rc = rmoe_ctx_calibrate_bus_once(ctx, &conf)))
		return rc;
#else
	/* StarPU charges every simulated cudaMalloc and pinned host allocation
	 * (175 us, 650 us per MiB); the frameworks the paper compares reuse
	 * device memory through a caching allocator, whose steady state costs
	 * nothing. STARPU_SIMGRID_CUDA_MALLOC_COST=1 restores StarPU's model. */
	setenv("STARPU_SIMGRID_CUDA_MALLOC_COST", "0", 0);
#endif
	/* Before StarPU allocates anything: every main-memory buffer it frees
	 * must come from the cache's hooks (codelets/probe/host_cache.c). Not beside
	 * CUDA workers, whose pinned host memory StarPU allocates itself. */
#ifdef STARPU_USE_CUDA
	const int may_pin = conf.ncuda != 0;
#else
	const int may_pin = 0;
#endif
	if (!may_pin) {
		if ((rc = rmoe_host_cache_install(rmoe_env(RMOE_ENV_HOST_CACHE))))
			return rc;
		ctx->host_cache = 1;
	}
	/* StarPU-MPI 1.3 keeps at most STARPU_MPI_NDETACHED_SEND detached
	 * sends in flight per rank (10 by default) and submits at most
	 * STARPU_MPI_NREADY_PROCESS ready requests between two polls (10): an
	 * all-to-all that posts every peer at once (a2a-megatron's stages, the
	 * other all-to-alls' every-peer depth) then runs in waves of ten, and
	 * its exchanges took 1.4-1.8x their no-overlap sum at EP 16 and 32 in
	 * the simulation (1.00x with room for all). Room for every peer and
	 * kind of the deepest pipeline, eight a peer; the user's values kept.
	 * A SimGrid build's StarPU-MPI reads them before main: there
	 * scripts/sim/platform.py's env.sh sets the same. */
	char room[32];
	snprintf(room, sizeof(room), "%d", 8 * (ctx->size > 2 ? ctx->size : 2));
	setenv("STARPU_MPI_NDETACHED_SEND", room, 0);
	setenv("STARPU_MPI_NREADY_PROCESS", room, 0);
	int ret = starpu_mpi_init_conf(NULL, NULL, 0, ctx->comm, &conf);
	/* The machine lacks the workers asked for (a CUDA-only run without a
	 * GPU): not supported here, which a test reads as "absent". */
	if (ret == -ENODEV)
		return rmoe_error(RMOE_ENOTSUP, "StarPU found no worker to run on (ncpus=%d, ncuda=%d)", conf.ncpus,
		                  conf.ncuda);
	if (ret != 0)
		return rmoe_error(RMOE_ESTARPU, "starpu_mpi_init_conf failed (%d)", ret);
	ctx->started_starpu_mpi = 1;
#ifdef STARPU_SIMGRID
	/* Simulated data carries nothing: StarPU's own buffers in main memory
	 * (temporaries, transfers staged through the host) are folded too, as
	 * the layer's are (layer.c). Not pinned: see the allocation cost above. */
	starpu_malloc_on_node_set_default_flags(STARPU_MAIN_RAM, STARPU_MALLOC_COUNT | STARPU_MALLOC_SIMULATION_FOLDED);
#endif
	return 0;
}
