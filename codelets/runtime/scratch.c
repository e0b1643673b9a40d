/* Device scratch declared to StarPU (STARPU_SCRATCH) instead of allocated
 * by a CUDA launcher behind its back: StarPU then allocates it on the node
 * of the worker that runs the task, reuses freed buffers of its size, and
 * counts it in that node's memory, as it counts the task's data. Built
 * only with CUDA codelets; otherwise no task declares any. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_cl_runtime.h"
#include "rmoe_system.h"

#ifdef RMOE_HAVE_CUDA
/* RMOE_SCRATCH_ON_CPU=1: declared where StarPU has no CUDA worker too, so
 * that a CUDA build's CPU tests run the tasks that carry it (their CPU
 * functions then get it and leave it alone). */
static int declare_without_cuda(void)
{
	const char *v = rmoe_env(RMOE_ENV_SCRATCH_ON_CPU);
	return v && !strcmp(v, "1");
}
#endif

int rmoe_cl_scratch(const char *op, size_t bytes, struct starpu_data_descr *d, int64_t *n)
{
	d->handle = NULL;
	d->mode = STARPU_SCRATCH;
	*n = 0;
#ifdef RMOE_HAVE_CUDA
	if (bytes == 0 || (starpu_cuda_worker_get_count() == 0 && !declare_without_cuda()))
		return 0;
	const uint64_t elements = ((uint64_t)bytes + 3) / 4;
	if (elements > UINT32_MAX)
		return rmoe_error(RMOE_EINVAL, "%s: a device scratch of %zu bytes, more than a StarPU vector holds", op,
		                  bytes);
	/* Home node -1: no copy anywhere, a buffer on whichever node runs the
	 * task, freed once the task ends (rmoe_cl_scratch_release). */
	starpu_vector_data_register(&d->handle, -1, 0, (uint32_t)elements, 4);
	rmoe_bookkeeping_count_handle();
	if (!d->handle)
		return rmoe_error(RMOE_ESTARPU, "%s: registering a device scratch of %zu bytes failed", op, bytes);
	*n = (int64_t)elements;
#else
	(void)op;
	(void)bytes;
#endif
	return 0;
}

void rmoe_cl_scratch_release(struct starpu_data_descr *d)
{
	if (d->handle)
		starpu_data_unregister_submit(d->handle);
	d->handle = NULL;
}
