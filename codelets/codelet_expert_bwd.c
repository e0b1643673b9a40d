/* The expert backward over one partition (grouped GEMM), in three modes:
 * pair-weighted (ring, §3.3: routing weights applied in the kernel, dg
 * produced there, the rows' dx written over the consumed x rows and added in
 * place), the same without the addition (the lean all-to-all: the rows' dx
 * stay in the x rows, which go back to their tokens' ranks) and preweighted
 * (Megatron's all-to-all, shared expert). */
#include "codelet.h"

/* Pair-weighted buffers: 0 x rows (consumed), 1 dy rows, 2 weights,
 * 3 pair_order, 4 topk_w, 5 work [m*4F], 6 dx [T*H], 7 dg, 8 dweights,
 * (9 the device scratch of the deterministic dx additions when
 * a->scratch); without dx (RMOE_BWD_PAIR_ROWS) the first nine less buffer
 * 6, unpacked with p[6] = NULL so that the kernels skip the addition.
 * Preweighted: 0 x rows, 1 dout rows, 2 weights, 3 work [m*3F], 4 dx rows,
 * 5 dweights. */
static int expert_bwd_unpack(void *buffers[], const struct rmoe_expert_args *a, void **p)
{
	const int rows_only = a->mode == RMOE_BWD_PAIR_ROWS, pw = a->mode == RMOE_BWD_PAIR_WEIGHTED || rows_only;
	if (rmoe_expert_args_check("expert-bwd", a))
		return -1;
	if (!pw && a->mode != RMOE_BWD_PREWEIGHTED)
		return rmoe_cl_fail("expert-bwd", "mode %d is not an enum rmoe_expert_bwd_mode", a->mode);
	if (a->scratch < 0 || (a->scratch > 0 && a->mode != RMOE_BWD_PAIR_WEIGHTED))
		return rmoe_cl_fail("expert-bwd", "a device scratch of %lld elements in mode %d", (long long)a->scratch,
		                    a->mode);
	struct starpu_task *task = starpu_task_get_current();
	const int64_t H = a->hidden, F = a->ffn, m = a->rows, W = rmoe_partition_weights_count(a->n_experts, H, F);
	/* The pair order (pair-weighted) sizes dx and dg. */
	const int64_t n_pairs = pw && task && STARPU_TASK_GET_NBUFFERS(task) > 3 ? (int64_t)STARPU_VECTOR_GET_NX(buffers[3]) : 0;
	if (pw && !(a->first >= 0 && a->first + m <= n_pairs && a->topk > 0 && n_pairs % a->topk == 0))
		return rmoe_cl_fail("expert-bwd", "slice [%lld, %lld) of %lld pairs with K=%lld", (long long)a->first,
		                    (long long)(a->first + m), (long long)n_pairs, (long long)a->topk);
	const struct rmoe_cl_buffer pair_weighted[] = {
		RMOE_CL_BUF("x rows", m * H),     RMOE_CL_BUF("dy rows", m * H),    RMOE_CL_BUF("weights", W),
		RMOE_CL_BUF("pair_order", n_pairs), RMOE_CL_BUF("topk_w", n_pairs), RMOE_CL_BUF("work", 4 * m * F),
		RMOE_CL_BUF("dx", pw ? n_pairs / a->topk * H : 0), RMOE_CL_BUF("dg", n_pairs), RMOE_CL_BUF("dweights", W),
		RMOE_CL_BUF("scratch", a->scratch)};
	const struct rmoe_cl_buffer pair_rows[] = {
		RMOE_CL_BUF("x rows", m * H),     RMOE_CL_BUF("dy rows", m * H),    RMOE_CL_BUF("weights", W),
		RMOE_CL_BUF("pair_order", n_pairs), RMOE_CL_BUF("topk_w", n_pairs), RMOE_CL_BUF("work", 4 * m * F),
		RMOE_CL_BUF("dg", n_pairs),       RMOE_CL_BUF("dweights", W)};
	const struct rmoe_cl_buffer preweighted[] = {RMOE_CL_BUF("x rows", m * H), RMOE_CL_BUF("dout rows", m * H),
	                                             RMOE_CL_BUF("weights", W),    RMOE_CL_BUF("work", 3 * m * F),
	                                             RMOE_CL_BUF("dx rows", m * H), RMOE_CL_BUF("dweights", W)};
	if (rows_only) {
		if (rmoe_cl_unpack("expert-bwd (pair rows)", buffers, pair_rows, 8, p))
			return -1;
		p[8] = p[7];
		p[7] = p[6];
		p[6] = NULL;
		return 0;
	}
	return rmoe_cl_unpack(pw ? "expert-bwd (pair-weighted)" : "expert-bwd (preweighted)", buffers,
	                      pw ? pair_weighted : preweighted, pw ? 9 + (a->scratch > 0) : 6, p);
}

static void rmoe_expert_bwd_cpu(void *buffers[], void *cl_arg)
{
	const struct rmoe_expert_args *a = cl_arg;
	void *p[10];
	rmoe_cl_test_delay();
	if (expert_bwd_unpack(buffers, a, p))
		return;
	if (a->mode == RMOE_BWD_PREWEIGHTED) {
		rmoe_kernel_expert_bwd_preweighted(a->hidden, a->ffn, a->n_experts, a->rows_per_expert, a->rows,
		                                   a->accumulate, p[0], p[1], p[2], p[3], p[4], p[5]);
		return;
	}
	const int64_t n_pairs = (int64_t)STARPU_VECTOR_GET_NX(buffers[3]);
	int64_t bad = rmoe_kernel_first_bad_pair(p[3], a->first, a->rows, n_pairs);
	if (bad >= 0) {
		rmoe_cl_fail("expert-bwd", "pair_order[%lld] = %d, not a pair of %lld", (long long)(a->first + bad),
		             (int)((const int32_t *)p[3])[a->first + bad], (long long)n_pairs);
		return;
	}
	rmoe_kernel_expert_bwd_pairs(a->hidden, a->ffn, a->n_experts, a->rows_per_expert, a->rows, a->first, a->topk,
	                             a->accumulate, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]);
}

#ifdef RMOE_HAVE_CUDA
static void expert_bwd_cuda(void *buffers[], void *cl_arg)
{
	const struct rmoe_expert_args *a = cl_arg;
	void *p[10];
	if (expert_bwd_unpack(buffers, a, p))
		return;
	const int bf16 = rmoe_cl_elsize(buffers[0]) == 2;
	if (a->mode == RMOE_BWD_PREWEIGHTED)
		rmoe_cl_cuda_done("expert-bwd", rmoe_cuda_expert_bwd_preweighted(
			                                RMOE_STREAM, rmoe_cl_cublas(), bf16, a->hidden, a->ffn, a->n_experts,
			                                a->rows_per_expert, a->rows, a->accumulate, p[0], p[1], p[2], p[3], p[4],
			                                p[5]));
	else
		rmoe_cl_cuda_done("expert-bwd", rmoe_cuda_expert_bwd_pairs(
			                                RMOE_STREAM, rmoe_cl_cublas(), bf16, a->hidden, a->ffn, a->n_experts,
			                                a->rows_per_expert, a->rows, (int64_t)STARPU_VECTOR_GET_NX(buffers[3]),
			                                a->first, a->topk, a->accumulate, p[0], p[1], p[2], p[3], p[4], p[5], p[6],
			                                p[7], p[8], a->deterministic, rmoe_cl_cuda_scratch(buffers, a->scratch)));
}
#endif

/* Nine buffers in the pair-weighted mode (eight without dx, ten with the
 * device scratch), more than STARPU_NMAXBUFS. */
RMOE_CODELET(rmoe_cl_expert_bwd, "expert-bwd", rmoe_expert_bwd_cpu, expert_bwd_cuda, "rmoe_expert_bwd_v2",
             expert_bwd, STARPU_VARIABLE_NBUFFERS);

static int insert_expert_bwd(const struct rmoe_task_opts *o, const struct rmoe_expert_shape *s, int mode,
                             int accumulate, int64_t first, int64_t topk, struct starpu_data_descr *d, int nd,
                             int64_t scratch)
{
	struct rmoe_expert_args *a = rmoe_expert_args_from(s);
	if (a) {
		a->mode = mode;
		a->accumulate = accumulate;
		a->first = first;
		a->topk = topk;
		a->deterministic = o->deterministic;
		a->scratch = scratch;
	}
	return rmoe_cl_insert(o, &rmoe_cl_expert_bwd, d, nd + (scratch > 0), a, rmoe_expert_args_size(s->n_experts),
	                      rmoe_flops_expert_bwd(s->rows, s->hidden, s->ffn));
}

int rmoe_insert_expert_bwd_pairs(const struct rmoe_task_opts *o, const struct rmoe_expert_shape *s,
                                 int64_t first, int64_t topk, int accumulate, starpu_data_handle_t xrows,
                                 starpu_data_handle_t dyrows, starpu_data_handle_t weights,
                                 starpu_data_handle_t pair_order, starpu_data_handle_t topk_w,
                                 starpu_data_handle_t work, starpu_data_handle_t dx, starpu_data_handle_t dg,
                                 starpu_data_handle_t dweights)
{
	/* x rows become the rows' dx; dg's pairs are disjoint across tasks. */
	struct starpu_data_descr d[10] = {
		{xrows, STARPU_RW},     {dyrows, STARPU_R},          {weights, STARPU_R},
		{pair_order, STARPU_R}, {topk_w, STARPU_R},          {work, STARPU_RW},
		{dx, rmoe_cl_acc_mode(o)}, {dg, STARPU_RW | STARPU_COMMUTE},
		{dweights, accumulate ? STARPU_RW : STARPU_W},
	};
	if (!dx) {
		/* No dx target: the rows' dx are the result, left in xrows. */
		d[6] = d[7];
		d[7] = d[8];
		return insert_expert_bwd(o, s, RMOE_BWD_PAIR_ROWS, accumulate, first, topk, d, 8, 0);
	}
	/* A CUDA worker adds the rows' dx without atomics, through a pair
	 * index in its device scratch, beside the grouped GEMMs' pointer
	 * arrays: StarPU allocates and counts both. */
	size_t bytes = 0;
#ifdef RMOE_HAVE_CUDA
	bytes = rmoe_cuda_expert_bwd_scratch(o->deterministic, (int64_t)starpu_vector_get_nx(pair_order), s->n_experts);
#endif
	int64_t scratch;
	int rc = rmoe_cl_scratch("expert-bwd", bytes, &d[9], &scratch);
	if (!rc)
		rc = insert_expert_bwd(o, s, RMOE_BWD_PAIR_WEIGHTED, accumulate, first, topk, d, 9, scratch);
	rmoe_cl_scratch_release(&d[9]);
	return rc;
}

int rmoe_insert_expert_bwd_preweighted(const struct rmoe_task_opts *o, const struct rmoe_expert_shape *s,
                                       int accumulate, starpu_data_handle_t xrows, starpu_data_handle_t doutrows,
                                       starpu_data_handle_t weights, starpu_data_handle_t work,
                                       starpu_data_handle_t dxrows, starpu_data_handle_t dweights)
{
	struct starpu_data_descr d[6] = {
		{xrows, STARPU_R}, {doutrows, STARPU_R}, {weights, STARPU_R},
		{work, STARPU_RW}, {dxrows, STARPU_W},   {dweights, accumulate ? STARPU_RW : STARPU_W},
	};
	return insert_expert_bwd(o, s, RMOE_BWD_PREWEIGHTED, accumulate, 0, 0, d, 6, 0);
}
