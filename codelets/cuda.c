/* The CUDA side shared by the codelets: one cuBLAS handle per CUDA worker,
 * bound to the worker's stream, for as long as a context uses StarPU. Built
 * only with -DRMOE_CUDA=ON. */
#include "codelet.h"

#ifdef RMOE_HAVE_CUDA
#include <cublas_v2.h>
#include <starpu_cuda.h>

static cublasHandle_t handles[STARPU_NMAXWORKERS];
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
	if (users++ == 0 && starpu_cuda_worker_get_count() > 0)
		starpu_execute_on_each_worker(create_handle, NULL, STARPU_CUDA);
}

void rmoe_codelets_stop(void)
{
	if (users > 0 && --users == 0 && starpu_cuda_worker_get_count() > 0)
		starpu_execute_on_each_worker(destroy_handle, NULL, STARPU_CUDA);
}

cublasHandle_t rmoe_cl_cublas(void)
{
	int w = starpu_worker_get_id();
	return w >= 0 ? handles[w] : NULL;
}

int rmoe_cl_cuda_done(const char *op, int rc)
{
	if (rc)
		return rmoe_cl_fail(op, "a CUDA kernel or cuBLAS call failed (its error is printed above)");
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
