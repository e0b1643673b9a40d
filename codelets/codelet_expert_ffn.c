/* The expert FFN: SwiGLU over one partition's rows (grouped GEMM: one task
 * for all the partition's experts), and its §3.3 recompute, which stops at
 * the SwiGLU output. */
#include "codelet.h"

/* buffers: 0 rows, 1 weights, 2 work, (3 out: expert-ffn only). A
 * recompute may fill the [m*4F] workspace of the pair-weighted backward. */
static int expert_ffn_unpack(const char *op, void *buffers[], const struct rmoe_expert_args *a, int with_down,
                             void **p)
{
	if (rmoe_expert_args_check(op, a))
		return -1;
	const int64_t H = a->hidden, F = a->ffn, m = a->rows;
	const struct rmoe_cl_buffer spec[] = {RMOE_CL_BUF("rows", m * H),
	                                      RMOE_CL_BUF("weights", rmoe_partition_weights_count(a->n_experts, H, F)),
	                                      {"work", 3 * m * F, with_down ? -1 : 4 * m * F},
	                                      RMOE_CL_BUF("out", m * H)};
	return rmoe_cl_unpack(op, buffers, spec, with_down ? 4 : 3, p);
}

static void expert_ffn_cpu(const char *op, void *buffers[], const struct rmoe_expert_args *a, int with_down)
{
	void *p[4] = {NULL};
	rmoe_cl_test_delay();
	if (!expert_ffn_unpack(op, buffers, a, with_down, p))
		rmoe_kernel_expert_ffn(a->hidden, a->ffn, a->n_experts, a->rows_per_expert, a->rows, p[0], p[1], p[2], p[3]);
}

#ifdef RMOE_HAVE_CUDA
static void expert_ffn_cuda_in(const char *op, void *buffers[], const struct rmoe_expert_args *a, int with_down)
{
	void *p[4] = {NULL};
	if (expert_ffn_unpack(op, buffers, a, with_down, p))
		return;
	rmoe_cl_cuda_done(op, rmoe_cuda_expert_ffn(RMOE_STREAM, rmoe_cl_cublas(), rmoe_cl_elsize(buffers[0]) == 2,
	                                           a->hidden, a->ffn, a->n_experts, a->rows_per_expert, a->rows, p[0],
	                                           p[1], p[2], p[3]));
}

static void expert_ffn_cuda(void *buffers[], void *cl_arg)
{
	expert_ffn_cuda_in("expert-ffn", buffers, cl_arg, 1);
}

static void expert_recompute_cuda(void *buffers[], void *cl_arg)
{
	expert_ffn_cuda_in("recompute", buffers, cl_arg, 0);
}
#endif

static void rmoe_expert_ffn_cpu(void *buffers[], void *cl_arg)
{
	expert_ffn_cpu("expert-ffn", buffers, cl_arg, 1);
}

static void rmoe_expert_recompute_cpu(void *buffers[], void *cl_arg)
{
	expert_ffn_cpu("recompute", buffers, cl_arg, 0);
}

RMOE_CODELET(rmoe_cl_expert_ffn, "expert-ffn", rmoe_expert_ffn_cpu, expert_ffn_cuda, "rmoe_expert_ffn_v2",
             expert_ffn, 4);
/* §3.3: a hop's intermediates rebuilt just before its backward consumes them. */
RMOE_CODELET(rmoe_cl_expert_recompute, "recompute", rmoe_expert_recompute_cpu, expert_recompute_cuda,
             "rmoe_expert_recompute_v2", expert_ffn, 3);

int rmoe_insert_expert_ffn(const struct rmoe_task_opts *o, const struct rmoe_expert_shape *s,
                           starpu_data_handle_t rows, starpu_data_handle_t weights, starpu_data_handle_t work,
                           starpu_data_handle_t out)
{
	struct starpu_data_descr d[4] = {{rows, STARPU_R}, {weights, STARPU_R}, {work, STARPU_W}, {out, STARPU_W}};
	return rmoe_cl_insert(o, out ? &rmoe_cl_expert_ffn : &rmoe_cl_expert_recompute, d, out ? 4 : 3,
	                      rmoe_expert_args_from(s), rmoe_expert_args_size(s->n_experts),
	                      rmoe_flops_expert_ffn(s->rows, s->hidden, s->ffn, out != NULL));
}
