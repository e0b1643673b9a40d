/* The dispatch map: pairs sorted by expert, with the counts the host reads
 * to size every hop. */
#include "codelet.h"

/* buffers: 0 topk_idx, 1 pair_order, 2 expert_counts, (3 the device
 * scratch when a->scratch) */
static int dispatch_map_unpack(void *buffers[], const struct rmoe_dispatch_map_args *a, void **p)
{
	const int64_t P = a->tokens * a->topk;
	if (!(a->tokens >= 0 && a->topk >= 1 && a->experts >= 1 && P <= INT32_MAX && a->scratch >= 0))
		return rmoe_cl_fail("dispatch-map", "bad shape T=%lld K=%lld E=%lld", (long long)a->tokens,
		                    (long long)a->topk, (long long)a->experts);
	const struct rmoe_cl_buffer spec[] = {RMOE_CL_BUF("topk_idx", P), RMOE_CL_BUF("pair_order", P),
	                                      RMOE_CL_BUF("expert_counts", a->experts),
	                                      RMOE_CL_BUF("scratch", a->scratch)};
	return rmoe_cl_unpack("dispatch-map", buffers, spec, 3 + (a->scratch > 0), p);
}

#ifdef RMOE_HAVE_CUDA
static void dispatch_map_cuda(void *buffers[], void *cl_arg)
{
	const struct rmoe_dispatch_map_args *a = cl_arg;
	void *p[4];
	if (!dispatch_map_unpack(buffers, a, p))
		rmoe_cl_cuda_done("dispatch-map", rmoe_cuda_dispatch_map(RMOE_STREAM, a->tokens * a->topk, a->experts, p[0],
		                                                         p[1], p[2], rmoe_cl_cuda_scratch(buffers, a->scratch)));
}
#endif

static void rmoe_dispatch_map_cpu(void *buffers[], void *cl_arg)
{
	const struct rmoe_dispatch_map_args *a = cl_arg;
	const int64_t P = a->tokens * a->topk;
	void *p[4];
	if (dispatch_map_unpack(buffers, a, p))
		return;
	int64_t bad = rmoe_kernel_dispatch_map(P, a->experts, p[0], p[1], p[2]);
	if (bad >= 0)
		rmoe_cl_fail("dispatch-map", "topk_idx[%lld] = %d, not an expert of %lld", (long long)bad,
		             (int)((const int32_t *)p[0])[bad], (long long)a->experts);
}

/* 3 buffers, 4 with the device scratch. */
RMOE_CODELET(rmoe_cl_dispatch_map, "dispatch-map", rmoe_dispatch_map_cpu, dispatch_map_cuda, "rmoe_dispatch_map_v1",
             dispatch_map, STARPU_VARIABLE_NBUFFERS);

int rmoe_insert_dispatch_map(const struct rmoe_task_opts *o, int64_t tokens, int64_t topk, int64_t experts,
                             starpu_data_handle_t topk_idx, starpu_data_handle_t pair_order,
                             starpu_data_handle_t expert_counts)
{
	struct rmoe_dispatch_map_args a = {tokens, topk, experts, 0};
	struct starpu_data_descr d[4] = {{topk_idx, STARPU_R}, {pair_order, STARPU_W}, {expert_counts, STARPU_W}};
	size_t bytes = 0;
#ifdef RMOE_HAVE_CUDA
	/* The device radix sort's keys, values and storage. */
	bytes = tokens >= 0 && topk >= 1 ? rmoe_cuda_dispatch_map_scratch(tokens * topk, experts) : 0;
#endif
	int rc = rmoe_cl_scratch("dispatch-map", bytes, &d[3], &a.scratch);
	if (!rc)
		rc = rmoe_cl_insert(o, &rmoe_cl_dispatch_map, d, 3 + (a.scratch > 0), rmoe_cl_args_dup(&a, sizeof(a)),
		                    sizeof(a), 0);
	rmoe_cl_scratch_release(&d[3]);
	return rc;
}
