/* What a context runs on (policy, workers, StarPU's build), and the buffers
 * of the _raw calls (rmoe_ctx_alloc, _free, _copy): StarPU's allocator and
 * copy paths, so that a device buffer is counted in the device's memory as
 * the layer's own buffers are, and a copy between the host and the device
 * takes the path StarPU's transfers take. */
#include <stdio.h>
#include <string.h>

#include <starpu.h>

#include "rmoe_ctx.h"
#include "rmoe_scheduler.h"

const char *rmoe_ctx_sched_policy(const rmoe_ctx *ctx)
{
	struct starpu_sched_policy *p = ctx ? starpu_sched_ctx_get_sched_policy(0) : NULL;
	return p ? p->policy_name : NULL;
}

int rmoe_ctx_workers(const rmoe_ctx *ctx, int *cpu_workers, int *cuda_workers)
{
	if (!ctx || !cpu_workers || !cuda_workers)
		return rmoe_error(RMOE_EINVAL, "rmoe_ctx_workers: no argument may be NULL");
	*cpu_workers = (int)starpu_cpu_worker_get_count();
	*cuda_workers = (int)starpu_cuda_worker_get_count();
	return 0;
}

int rmoe_ctx_blas_threads(const rmoe_ctx *ctx)
{
	return ctx ? ctx->blas_threads : -1;
}

const char *rmoe_starpu_build(void)
{
	static char build[64];
	int major, minor, release;
	starpu_get_version(&major, &minor, &release);
	snprintf(build, sizeof(build), "%d.%d.%d%s%s%s", major, minor, release,
#ifdef STARPU_USE_CUDA
	         " cuda",
#else
	         "",
#endif
#ifdef STARPU_USE_FXT
	         " fxt",
#else
	         "",
#endif
#ifdef STARPU_SIMGRID
	         " simgrid"
#else
	         ""
#endif
	);
	return build;
}

int rmoe_ctx_device_node(const rmoe_ctx *ctx)
{
	(void)ctx;
	int w = starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0);
	return w < 0 ? -1 : (int)starpu_worker_get_memory_node((unsigned)w);
}

static const char *where_name(enum rmoe_memory where)
{
	return where == RMOE_MEMORY_DEVICE ? "the device" : "the host";
}

static int where_node(const rmoe_ctx *ctx, enum rmoe_memory where, const char *call, int *node)
{
	if (!ctx)
		return rmoe_error(RMOE_EINVAL, "%s: ctx must not be NULL", call);
	if (where == RMOE_MEMORY_HOST) {
		*node = STARPU_MAIN_RAM;
		return 0;
	}
	if (where != RMOE_MEMORY_DEVICE)
		return rmoe_error(RMOE_EINVAL, "%s: where = %d: expected RMOE_MEMORY_HOST or RMOE_MEMORY_DEVICE", call,
		                  (int)where);
	if ((*node = rmoe_ctx_device_node(ctx)) < 0)
		return rmoe_error(RMOE_ENOTSUP, "%s: RMOE_MEMORY_DEVICE but rank %d has no CUDA worker", call, ctx->rank);
	return 0;
}

int rmoe_ctx_alloc(rmoe_ctx *ctx, enum rmoe_memory where, size_t bytes, void **ptr)
{
	int node, rc;
	if (!ptr)
		return rmoe_error(RMOE_EINVAL, "rmoe_ctx_alloc: ptr must not be NULL");
	*ptr = NULL;
	if ((rc = where_node(ctx, where, "rmoe_ctx_alloc", &node)))
		return rc;
	if (bytes == 0)
		return rmoe_error(RMOE_EINVAL, "rmoe_ctx_alloc: bytes = 0: expected a positive size");
	/* Main memory comes pinned where a CUDA worker exists (StarPU's
	 * default flags), as StarPU's own staging buffers. */
	uintptr_t p = starpu_malloc_on_node(node, bytes);
	if (!p)
		return rmoe_error(RMOE_ENOMEM, "rmoe_ctx_alloc: %zu bytes on %s of rank %d: out of memory", bytes,
		                  where_name(where), ctx->rank);
	*ptr = (void *)p;
	return 0;
}

int rmoe_ctx_free(rmoe_ctx *ctx, enum rmoe_memory where, void *ptr, size_t bytes)
{
	int node, rc;
	if ((rc = where_node(ctx, where, "rmoe_ctx_free", &node)))
		return rc;
	if (ptr)
		starpu_free_on_node(node, (uintptr_t)ptr, bytes);
	return 0;
}

int rmoe_ctx_copy(rmoe_ctx *ctx, void *dst, enum rmoe_memory dst_where, const void *src, enum rmoe_memory src_where,
                  size_t bytes)
{
	int dnode, snode, rc;
	if ((rc = where_node(ctx, dst_where, "rmoe_ctx_copy", &dnode)) ||
	    (rc = where_node(ctx, src_where, "rmoe_ctx_copy", &snode)))
		return rc;
	if (bytes == 0)
		return 0;
	if (!dst || !src)
		return rmoe_error(RMOE_EINVAL, "rmoe_ctx_copy: dst and src must not be NULL");
	/* No channel: the copy is synchronous (cudaMemcpy between the host and
	 * a device). */
	int ret = starpu_interface_copy((uintptr_t)src, 0, (unsigned)snode, (uintptr_t)dst, 0, (unsigned)dnode, bytes,
	                                NULL);
	if (ret)
		return rmoe_error(RMOE_ESTARPU, "rmoe_ctx_copy: %zu bytes from %s to %s failed (%d)", bytes,
		                  where_name(src_where), where_name(dst_where), ret);
	return 0;
}
