/* The CUDA side shared by the codelets: one cuBLAS handle per CUDA worker,
 * bound to the worker's stream, for as long as a context uses StarPU. Built
 * only with -DRMOE_CUDA=ON.
 *
 * Why not StarPU's handles (starpu_cublas_init, starpu_cublas_get_local_
 * handle): StarPU 1.3's (src/drivers/cuda/starpu_cublas.c) are made as
 * these are, one per CUDA worker, created on the worker and bound to its
 * starpu_cuda_get_local_stream(); but they are not counted. Each
 * starpu_cublas_init creates every worker's handle afresh over the last one,
 * and starpu_cublas_shutdown destroys them for every user in the process.
 * The library runs inside applications that may own StarPU and call that
 * pair for cuBLAS codelets of their own (it stops only what it started,
 * graph/context/ctx.c): calling it too would destroy the application's handles at
 * rmoe_ctx_destroy, and the application's shutdown would destroy the
 * library's under a live context. Handles of its own, counted, share
 * nothing with anyone. Also where the expert GEMMs' way is chosen for the
 * kernels (RMOE_CUDA_GEMM), which read no environment. */
#include <stdio.h>

#include "rmoe_cl_runtime.h"
#include "rmoe_system.h"

#ifdef RMOE_HAVE_CUDA
#include <pthread.h>

#include <cublas_v2.h>
#include <starpu_cuda.h>

static cublasHandle_t handles[STARPU_NMAXWORKERS];
/* Contexts using them: one per context alive, whatever threads create and
 * destroy contexts. */
static pthread_mutex_t users_lock = PTHREAD_MUTEX_INITIALIZER;
static int users;

static void create_handle(void *arg)
{
	(void)arg;
	int w = starpu_worker_get_id();
	if (cublasCreate(&handles[w]) != CUBLAS_STATUS_SUCCESS) {
		handles[w] = NULL;
		return;
	}
	cublasSetStream(handles[w], starpu_cuda_get_local_stream());
}

static void destroy_handle(void *arg)
{
	(void)arg;
	int w = starpu_worker_get_id();
	if (handles[w])
		cublasDestroy(handles[w]);
	handles[w] = NULL;
}

void rmoe_codelets_start(void)
{
	pthread_mutex_lock(&users_lock);
	if (users++ == 0) {
		/* The expert GEMMs' way (codelets/kernels/cuda_gemm.cuh), before
		 * any task runs; bench/gpu/run.sh picks the fastest with it. */
		const char *way = rmoe_env(RMOE_ENV_CUDA_GEMM);
		if (rmoe_cuda_gemm_select(way))
			fprintf(stderr, "relaymoe: RMOE_CUDA_GEMM=%s: expected grouped, strided or loop; %s taken\n", way,
			        rmoe_cuda_gemm_name());
		if (starpu_cuda_worker_get_count() > 0)
			starpu_execute_on_each_worker(create_handle, NULL, STARPU_CUDA);
	}
	pthread_mutex_unlock(&users_lock);
}

void rmoe_codelets_stop(void)
{
	pthread_mutex_lock(&users_lock);
	if (users > 0 && --users == 0 && starpu_cuda_worker_get_count() > 0)
		starpu_execute_on_each_worker(destroy_handle, NULL, STARPU_CUDA);
	pthread_mutex_unlock(&users_lock);
}

cublasHandle_t rmoe_cl_cublas(void)
{
	int w = starpu_worker_get_id();
	return w >= 0 ? handles[w] : NULL;
}

int rmoe_cl_cuda_done(const char *op, int rc)
{
	if (rc)
		return rmoe_cl_fail(op, "%s (its error is printed above)", rmoe_cuda_status_what(rc));
	if (!rmoe_cl_cublas())
		return rmoe_cl_fail(op, "no cuBLAS handle for CUDA worker %d", starpu_worker_get_id());
	return 0;
}
#else
void rmoe_codelets_start(void)
{
}

void rmoe_codelets_stop(void)
{
}
#endif
