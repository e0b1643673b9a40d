/* All-to-all combine backward: the expert-side gradient of each returned
 * row (g * dy of its token) and the routing-weight gradient of its pair. */
#include "kernels.h"
#include "rmoe_codelets.h"

static void rmoe_unpermute_bwd_cpu(void *buffers[], void *cl_arg)
{
	rmoe_probe_sample();
	const struct rmoe_rows_args *a = cl_arg;
	const int64_t H = a->hidden, K = a->topk;
	RMOE_CL_CHECK(H >= 1 && K >= 1 && a->first >= 0 && a->count >= 0,
	              "unpermute-bwd: bad arguments first=%lld count=%lld H=%lld K=%lld",
	              (long long)a->first, (long long)a->count, (long long)H, (long long)K);
	const int64_t n_pairs = rmoe_cl_nx(buffers[2]);
	RMOE_CL_CHECK(n_pairs % K == 0, "unpermute-bwd: %lld pairs, not a multiple of K=%lld",
	              (long long)n_pairs, (long long)K);
	RMOE_CL_CHECK(a->first + a->count <= n_pairs,
	              "unpermute-bwd: slice [%lld, %lld) beyond %lld pairs", (long long)a->first,
	              (long long)(a->first + a->count), (long long)n_pairs);
	RMOE_CL_CHECK_NX(buffers, 0, n_pairs / K * H, "dy");
	RMOE_CL_CHECK_NX(buffers, 1, a->count * H, "back rows");
	RMOE_CL_CHECK_NX(buffers, 3, n_pairs, "topk_w");
	RMOE_CL_CHECK_NX(buffers, 4, a->count * H, "dout rows");
	RMOE_CL_CHECK_NX(buffers, 5, n_pairs, "dg");
	const float *dy = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
	const float *back = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
	const int32_t *pair_order = (const int32_t *)STARPU_VECTOR_GET_PTR(buffers[2]);
	const float *topk_w = (const float *)STARPU_VECTOR_GET_PTR(buffers[3]);
	float *dout = (float *)STARPU_VECTOR_GET_PTR(buffers[4]);
	float *dg = (float *)STARPU_VECTOR_GET_PTR(buffers[5]);

	int64_t bad = rmoe_first_bad_pair(pair_order, a->first, a->count, n_pairs);
	RMOE_CL_CHECK(bad < 0, "unpermute-bwd: pair_order[%lld] = %d, not a pair of %lld",
	              (long long)(a->first + bad), (int)pair_order[a->first + bad], (long long)n_pairs);
	for (int64_t i = 0; i < a->count; i++) {
		int64_t p = pair_order[a->first + i];
		const float *dyt = dy + (p / K) * H;
		const float g = topk_w[p];
		float *d = dout + i * H;
		for (int64_t j = 0; j < H; j++)
			d[j] = g * dyt[j];
		dg[p] = rmoe_dot(dyt, back + i * H, H);
	}
}

#ifdef STARPU_USE_CUDA
/* CUDA kernel of unpermute-bwd: not written yet; the codelet runs on CPUs. */
#endif

static struct starpu_perfmodel rmoe_model_unpermute_bwd = RMOE_PERFMODEL("rmoe_unpermute_bwd_v1", rmoe_sim_cost_unpermute_bwd);

struct starpu_codelet rmoe_cl_unpermute_bwd = {
	.name = "unpermute-bwd",
	.cpu_funcs = {rmoe_unpermute_bwd_cpu},
	.cpu_funcs_name = {"rmoe_unpermute_bwd_cpu"},
	RMOE_SIM_CUDA_FUNCS
	.nbuffers = 6,
	.modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_W, STARPU_RW | STARPU_COMMUTE},
	.model = &rmoe_model_unpermute_bwd,
};
