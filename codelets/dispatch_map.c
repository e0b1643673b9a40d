/* Dispatch map: the pairs of all tokens sorted by expert (stable counting
 * sort), so that one partition's pairs are one slice of pair_order. */
#include <string.h>

#include "kernels.h"
#include "rmoe_codelets.h"

static void rmoe_dispatch_map_cpu(void *buffers[], void *cl_arg)
{
	rmoe_probe_sample();
	const struct rmoe_dispatch_map_args *a = cl_arg;
	RMOE_CL_CHECK(a->tokens >= 0 && a->topk >= 1 && a->experts >= 1 && a->tokens * a->topk <= INT32_MAX,
	              "dispatch-map: bad shape T=%lld K=%lld E=%lld", (long long)a->tokens,
	              (long long)a->topk, (long long)a->experts);
	const int64_t P = a->tokens * a->topk, E = a->experts;
	RMOE_CL_CHECK_NX(buffers, 0, P, "topk_idx");
	RMOE_CL_CHECK_NX(buffers, 1, P, "pair_order");
	RMOE_CL_CHECK_NX(buffers, 2, E, "expert_counts");
	const int32_t *topk_idx = (const int32_t *)STARPU_VECTOR_GET_PTR(buffers[0]);
	int32_t *pair_order = (int32_t *)STARPU_VECTOR_GET_PTR(buffers[1]);
	int32_t *counts = (int32_t *)STARPU_VECTOR_GET_PTR(buffers[2]);

	memset(counts, 0, (size_t)E * sizeof(int32_t));
	for (int64_t p = 0; p < P; p++) {
		RMOE_CL_CHECK(topk_idx[p] >= 0 && topk_idx[p] < E,
		              "dispatch-map: topk_idx[%lld] = %d, not an expert of %lld", (long long)p,
		              (int)topk_idx[p], (long long)E);
		counts[topk_idx[p]]++;
	}
	/* counts become start offsets, advanced while placing: each ends at the
	 * start of the next expert, from which the counts come back. */
	int32_t start = 0;
	for (int64_t e = 0; e < E; e++) {
		int32_t c = counts[e];
		counts[e] = start;
		start += c;
	}
	for (int64_t p = 0; p < P; p++)
		pair_order[counts[topk_idx[p]]++] = (int32_t)p;
	for (int64_t e = E - 1; e > 0; e--)
		counts[e] -= counts[e - 1];
}

#ifdef STARPU_USE_CUDA
/* CUDA kernel of the dispatch map: not written yet; the codelet runs on CPUs. */
#endif

static struct starpu_perfmodel rmoe_model_dispatch_map = RMOE_PERFMODEL("rmoe_dispatch_map_v1", rmoe_sim_cost_dispatch_map);

struct starpu_codelet rmoe_cl_dispatch_map = {
	.name = "dispatch-map",
	.cpu_funcs = {rmoe_dispatch_map_cpu},
	.cpu_funcs_name = {"rmoe_dispatch_map_cpu"},
	RMOE_SIM_CUDA_FUNCS
	.nbuffers = 3,
	.modes = {STARPU_R, STARPU_W, STARPU_W},
	.model = &rmoe_model_dispatch_map,
};
