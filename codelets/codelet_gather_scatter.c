/* The gather and its inverse, the scatter-add. The gather copies the rows
 * of one slice of the pair order from a [T, H] token matrix into a
 * contiguous [count, H] block (optionally weighted): a hop's (or chunk's)
 * matched rows. The scatter-add adds such a block of expert outputs into
 * the [T, H] rows of its pairs' tokens (optionally weighted): the combine of
 * one hop, §3.1's in-place accumulation. */
#include <stdio.h>

#include "codelet.h"

/* gather buffers: 0 src, 1 pair_order, 2 rows, (3 topk_w when weighted);
 * scatter-add buffers: 0 rows, 1 pair_order, 2 dst, (3 topk_w), then the
 * device scratch of its deterministic additions when a->scratch (n_pairs
 * int32). The same body on the CPU and (device set) on a CUDA worker. */
static void rows_body(void *buffers[], const struct rmoe_rows_args *a, int scatter, int device)
{
	const char *op = scatter ? "scatter-add" : "gather";
	const int weighted = a->weighted != 0, with_scratch = scatter && a->scratch > 0;
	const char *const names[5] = {scatter ? "rows" : "src", "pair_order", scatter ? "dst" : "rows",
	                              weighted ? "topk_w" : "scratch", "scratch"};
	char roles[8];
	snprintf(roles, sizeof(roles), "%s%s%s", scatter ? "RPT" : "TPR", weighted ? "W" : "", with_scratch ? "S" : "");
	void *p[5] = {NULL};
	if (rmoe_cl_rows_unpack(op, buffers, a, roles, names, !device, p))
		return;
	const float *topk_w = weighted ? p[3] : NULL;
#ifdef RMOE_HAVE_CUDA
	if (device) {
		const int bf16 = rmoe_cl_elsize(buffers[0]) == 2;
		const int64_t n_pairs = (int64_t)STARPU_VECTOR_GET_NX(buffers[1]);
		rmoe_cl_cuda_done(op, scatter ? rmoe_cuda_scatter_add(RMOE_STREAM, bf16, a->hidden, a->topk, n_pairs, a->first,
		                                                       a->count, p[0], p[1], topk_w, p[2], a->deterministic,
		                                                       rmoe_cl_cuda_scratch(buffers, with_scratch ? a->scratch : 0))
		                              : rmoe_cuda_gather(RMOE_STREAM, bf16, a->hidden, a->topk, a->first, a->count,
		                                                 p[0], p[1], topk_w, p[2]));
		return;
	}
#endif
	if (scatter)
		rmoe_kernel_scatter_add(a->hidden, a->topk, a->first, a->count, p[0], p[1], topk_w, p[2]);
	else
		rmoe_kernel_gather(a->hidden, a->topk, a->first, a->count, p[0], p[1], topk_w, p[2]);
}

static void rmoe_gather_cpu(void *buffers[], void *cl_arg)
{
	rows_body(buffers, cl_arg, 0, 0);
}

static void rmoe_scatter_add_cpu(void *buffers[], void *cl_arg)
{
	rows_body(buffers, cl_arg, 1, 0);
}

#ifdef RMOE_HAVE_CUDA
static void gather_cuda(void *buffers[], void *cl_arg)
{
	rows_body(buffers, cl_arg, 0, 1);
}

static void scatter_add_cuda(void *buffers[], void *cl_arg)
{
	rows_body(buffers, cl_arg, 1, 1);
}
#endif

/* Three or four buffers (topk_w only when weighted); the scatter-add's
 * device scratch one more. */
RMOE_CODELET(rmoe_cl_gather, "gather", rmoe_gather_cpu, gather_cuda, "rmoe_gather_v2", gather,
             STARPU_VARIABLE_NBUFFERS);
RMOE_CODELET(rmoe_cl_scatter_add, "scatter-add", rmoe_scatter_add_cpu, scatter_add_cuda, "rmoe_scatter_add_v2",
             scatter_add, STARPU_VARIABLE_NBUFFERS);

static int insert_rows(const struct rmoe_task_opts *o, struct starpu_codelet *cl, const struct rmoe_pair_slice *s,
                       struct starpu_data_descr *d, int weighted, int64_t scratch)
{
	struct rmoe_rows_args a = {s->first, s->count, s->hidden, s->topk, weighted, o->deterministic, scratch};
	return rmoe_cl_insert(o, cl, d, (weighted ? 4 : 3) + (scratch > 0), rmoe_cl_args_dup(&a, sizeof(a)), sizeof(a),
	                      0);
}

int rmoe_insert_gather(const struct rmoe_task_opts *o, const struct rmoe_pair_slice *s, starpu_data_handle_t src,
                       starpu_data_handle_t pair_order, starpu_data_handle_t topk_w, starpu_data_handle_t rows)
{
	struct starpu_data_descr d[4] = {
		{src, STARPU_R}, {pair_order, STARPU_R}, {rows, STARPU_W}, {topk_w, STARPU_R}};
	return insert_rows(o, &rmoe_cl_gather, s, d, topk_w != NULL, 0);
}

int rmoe_insert_scatter_add(const struct rmoe_task_opts *o, const struct rmoe_pair_slice *s,
                            starpu_data_handle_t rows, starpu_data_handle_t pair_order, starpu_data_handle_t topk_w,
                            starpu_data_handle_t dst)
{
	/* Contributions of different hops commute unless bit-reproducible sums
	 * are asked for; then a CUDA worker adds a task's rows without atomics
	 * too, through a pair index in its device scratch. */
	struct starpu_data_descr d[5] = {
		{rows, STARPU_R}, {pair_order, STARPU_R}, {dst, rmoe_cl_acc_mode(o)}, {topk_w, STARPU_R}};
	const int weighted = topk_w != NULL;
	size_t bytes = 0;
#ifdef RMOE_HAVE_CUDA
	bytes = rmoe_cuda_rows_add_scratch(o->deterministic, (int64_t)starpu_vector_get_nx(pair_order));
#endif
	int64_t scratch;
	int rc = rmoe_cl_scratch("scatter-add", bytes, &d[weighted ? 4 : 3], &scratch);
	if (!rc)
		rc = insert_rows(o, &rmoe_cl_scatter_add, s, d, weighted, scratch);
	rmoe_cl_scratch_release(&d[weighted ? 4 : 3]);
	return rc;
}
