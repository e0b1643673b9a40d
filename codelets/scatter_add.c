/* Scatter-add: a [count, H] block of expert outputs added into the [T, H]
 * rows of its pairs' tokens (optionally weighted): the combine of one hop. */
#include "kernels.h"
#include "rmoe_codelets.h"

static void rmoe_scatter_add_cpu(void *buffers[], void *cl_arg)
{
	rmoe_probe_sample();
	const struct rmoe_rows_args *a = cl_arg;
	const int64_t H = a->hidden, K = a->topk;
	RMOE_CL_CHECK(H >= 1 && K >= 1 && a->first >= 0 && a->count >= 0,
	              "scatter-add: bad arguments first=%lld count=%lld H=%lld K=%lld",
	              (long long)a->first, (long long)a->count, (long long)H, (long long)K);
	RMOE_CL_CHECK(rmoe_cl_nbuffers() == (a->weighted ? 4 : 3),
	              "scatter-add: %d buffers, expected %d (weighted=%d)", rmoe_cl_nbuffers(),
	              a->weighted ? 4 : 3, a->weighted);
	const int64_t n_pairs = rmoe_cl_nx(buffers[1]);
	RMOE_CL_CHECK(n_pairs % K == 0, "scatter-add: %lld pairs, not a multiple of K=%lld",
	              (long long)n_pairs, (long long)K);
	const int64_t tokens = n_pairs / K;
	RMOE_CL_CHECK_NX(buffers, 0, a->count * H, "rows");
	RMOE_CL_CHECK_NX(buffers, 2, tokens * H, "dst");
	RMOE_CL_CHECK(a->first + a->count <= n_pairs,
	              "scatter-add: slice [%lld, %lld) beyond %lld pairs", (long long)a->first,
	              (long long)(a->first + a->count), (long long)n_pairs);
	if (a->weighted)
		RMOE_CL_CHECK_NX(buffers, 3, n_pairs, "topk_w");
	const float *rows = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
	const int32_t *pair_order = (const int32_t *)STARPU_VECTOR_GET_PTR(buffers[1]);
	float *dst = (float *)STARPU_VECTOR_GET_PTR(buffers[2]);
	const float *topk_w = a->weighted ? (const float *)STARPU_VECTOR_GET_PTR(buffers[3]) : NULL;

	int64_t bad = rmoe_first_bad_pair(pair_order, a->first, a->count, n_pairs);
	RMOE_CL_CHECK(bad < 0, "scatter-add: pair_order[%lld] = %d, not a pair of %lld",
	              (long long)(a->first + bad), (int)pair_order[a->first + bad], (long long)n_pairs);
	for (int64_t i = 0; i < a->count; i++) {
		int64_t p = pair_order[a->first + i];
		int64_t t = p / K;
		float g = topk_w ? topk_w[p] : 1.0f;
		const float *r = rows + i * H;
		float *d = dst + t * H;
		for (int64_t j = 0; j < H; j++)
			d[j] += g * r[j];
	}
}

#ifdef STARPU_USE_CUDA
/* CUDA kernel of the scatter-add: not written yet; the codelet runs on CPUs. */
#endif

static struct starpu_perfmodel rmoe_model_scatter_add = RMOE_PERFMODEL("rmoe_scatter_add_v1", rmoe_sim_cost_rows);

/* Three or four buffers (topk_w only when weighted): modes come with the
 * insertion, dst as STARPU_RW | STARPU_COMMUTE. */
struct starpu_codelet rmoe_cl_scatter_add = {
	.name = "scatter-add",
	.cpu_funcs = {rmoe_scatter_add_cpu},
	.cpu_funcs_name = {"rmoe_scatter_add_cpu"},
	RMOE_SIM_CUDA_FUNCS
	.nbuffers = STARPU_VARIABLE_NBUFFERS,
	.model = &rmoe_model_scatter_add,
};
