/* The all-to-all's combine backward: the expert-side gradient of each
 * returned row (g * dy of its token) and the routing-weight gradient of its
 * pair. */
#include "codelet.h"

/* buffers: 0 dy, 1 back rows, 2 pair_order, 3 topk_w, 4 dout rows, 5 dg */
static const char *const unpermute_bwd_buffers[] = {"dy", "back rows", "pair_order", "topk_w", "dout rows", "dg"};

static void rmoe_unpermute_bwd_cpu(void *buffers[], void *cl_arg)
{
	const struct rmoe_rows_args *a = cl_arg;
	void *p[6];
	if (!rmoe_cl_rows_unpack("unpermute-bwd", buffers, a, "TRPWRG", unpermute_bwd_buffers, 1, p))
		rmoe_kernel_unpermute_bwd(a->hidden, a->topk, a->first, a->count, p[0], p[1], p[2], p[3], p[4], p[5]);
}

#ifdef RMOE_HAVE_CUDA
static void unpermute_bwd_cuda(void *buffers[], void *cl_arg)
{
	const struct rmoe_rows_args *a = cl_arg;
	void *p[6];
	if (!rmoe_cl_rows_unpack("unpermute-bwd", buffers, a, "TRPWRG", unpermute_bwd_buffers, 0, p))
		rmoe_cl_cuda_done("unpermute-bwd", rmoe_cuda_unpermute_bwd(RMOE_STREAM, rmoe_cl_elsize(buffers[0]) == 2,
		                                                           a->hidden, a->topk, a->first, a->count, p[0], p[1],
		                                                           p[2], p[3], p[4], p[5]));
}
#endif

RMOE_CODELET(rmoe_cl_unpermute_bwd, "unpermute-bwd", rmoe_unpermute_bwd_cpu, unpermute_bwd_cuda,
             "rmoe_unpermute_bwd_v2", unpermute_bwd, 6);

int rmoe_insert_unpermute_bwd(const struct rmoe_task_opts *o, const struct rmoe_pair_slice *s,
                              starpu_data_handle_t dy, starpu_data_handle_t back, starpu_data_handle_t pair_order,
                              starpu_data_handle_t topk_w, starpu_data_handle_t dout, starpu_data_handle_t dg)
{
	struct rmoe_rows_args a = {s->first, s->count, s->hidden, s->topk, 0, 0, 0};
	/* dg: each task writes its own slice's pairs. */
	struct starpu_data_descr d[6] = {{dy, STARPU_R},     {back, STARPU_R}, {pair_order, STARPU_R},
	                                 {topk_w, STARPU_R}, {dout, STARPU_W}, {dg, STARPU_RW | STARPU_COMMUTE}};
	return rmoe_cl_insert(o, &rmoe_cl_unpermute_bwd, d, 6, rmoe_cl_args_dup(&a, sizeof(a)), sizeof(a), 0);
}
