/* The BLAS threads of a context's workers, and the advice when OpenBLAS
 * runs kernels narrower than the CPU's. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <starpu.h>

#include "rmoe_codelets.h"
#include "rmoe_ctx.h"

/* OpenBLAS threads per call when the user did not say (rmoe_ctx_config.
 * blas_threads): OPENBLAS_NUM_THREADS when set (the user's, as OpenBLAS
 * itself reads it), otherwise the rank's share of the cores it may run on, less
 * its CUDA workers' driver threads, over its CPU workers. A pass is a chain
 * of expert tasks (one per hop), so with one BLAS thread per worker the
 * cores a rank's workers leave (1 rank on 2 cores: ctx_starpu.c gives one
 * worker) would idle through every GEMM; the share keeps ranks that share
 * the node's cores (2 ranks on 2 cores: 1 thread each) and workers running
 * GEMMs side by side from oversubscribing them. */
static int auto_blas_threads(int local_size)
{
	const char *env = getenv("OPENBLAS_NUM_THREADS");
	if (env && *env) {
		char *end;
		long n = strtol(env, &end, 10);
		if (!*end && n >= 1 && n <= 4096)
			return (int)n;
	}
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	/* A process confined to fewer CPUs (a container's cpuset, mpirun's
	 * binding) has only those: its ranks on the node then share at most
	 * them, never more threads than CPUs. */
	cpu_set_t allowed;
	if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_COUNT(&allowed) < cores)
		cores = CPU_COUNT(&allowed);
	long share = (cores > 0 ? cores : 1) / (local_size > 0 ? local_size : 1);
	share -= (long)starpu_cuda_worker_get_count();
	long workers = (long)starpu_cpu_worker_get_count();
	long n = workers > 0 ? share / workers : 1;
	return n > 1 ? (int)n : 1;
}

void rmoe_ctx_blas_setup(rmoe_ctx *ctx, const struct rmoe_ctx_config *cfg)
{
	ctx->blas_threads =
	        rmoe_codelets_blas_threads(cfg->blas_threads > 0 ? cfg->blas_threads : auto_blas_threads(ctx->local_size));
	const char *advice = rmoe_blas_core_advice();
	if (advice && ctx->rank == 0)
		fprintf(stderr, "relaymoe: OpenBLAS runs its %s kernels on a CPU with wider vectors: start the program "
		        "with OPENBLAS_CORETYPE=%s in its environment for GEMMs several times faster\n",
		        rmoe_blas_core(), advice);
	if (ctx->verbose)
		fprintf(stderr, "relaymoe: rank %d: %u CPU worker(s), %d OpenBLAS thread(s) per call%s\n", ctx->rank,
		        starpu_cpu_worker_get_count(), ctx->blas_threads,
		        cfg->blas_threads > 0 ? "" : " (automatic)");
}
