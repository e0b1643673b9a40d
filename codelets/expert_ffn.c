/* Expert FFN over one partition (grouped GEMM: one task, one GEMM per expert
 * and matrix), and its §3.3 recompute, which stops at the SwiGLU output. */
#include <cblas.h>

#include "kernels.h"
#include "rmoe_codelets.h"

/* buffers: 0 rows, 1 weights, 2 work, (3 out: expert_ffn only). */
static void rmoe_expert_ffn_cpu(void *buffers[], void *cl_arg)
{
	rmoe_probe_sample();
	const struct rmoe_expert_args *a = cl_arg;
	RMOE_CL_CHECK(rmoe_expert_args_ok(a),
	              "expert-ffn: bad shape H=%lld F=%lld experts=%lld rows=%lld (or rows_per_expert)",
	              (long long)a->hidden, (long long)a->ffn, (long long)a->n_experts,
	              (long long)a->rows);
	const int64_t H = a->hidden, F = a->ffn, ne = a->n_experts, m = a->rows;
	const int with_down = rmoe_cl_nbuffers() == 4;
	RMOE_CL_CHECK_NX(buffers, 0, m * H, "rows");
	RMOE_CL_CHECK_NX(buffers, 1, rmoe_partition_weights_count(ne, H, F), "weights");
	/* A recompute may fill the [m*4F] workspace of the pair-weighted backward. */
	RMOE_CL_CHECK(rmoe_cl_nx(buffers[2]) == 3 * m * F ||
	                      (!with_down && rmoe_cl_nx(buffers[2]) == 4 * m * F),
	              "expert-ffn: work has %lld elements, expected %lld", (long long)rmoe_cl_nx(buffers[2]),
	              (long long)(3 * m * F));
	if (with_down)
		RMOE_CL_CHECK_NX(buffers, 3, m * H, "out");
	const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
	float *w = (float *)STARPU_VECTOR_GET_PTR(buffers[1]);
	float *work = (float *)STARPU_VECTOR_GET_PTR(buffers[2]);
	float *out = with_down ? (float *)STARPU_VECTOR_GET_PTR(buffers[3]) : NULL;
	float *gate = work, *up = work + m * F, *act = work + 2 * m * F;

	int64_t o = 0;
	for (int64_t e = 0; e < ne; o += a->rows_per_expert[e], e++) {
		const int64_t r = a->rows_per_expert[e];
		if (r == 0)
			continue;
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)r, (int)F, (int)H, 1.0f,
		            x + o * H, (int)H, rmoe_w_gate(w, ne, H, F, e), (int)F, 0.0f, gate + o * F,
		            (int)F);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)r, (int)F, (int)H, 1.0f,
		            x + o * H, (int)H, rmoe_w_up(w, ne, H, F, e), (int)F, 0.0f, up + o * F, (int)F);
		for (int64_t i = o * F; i < (o + r) * F; i++)
			act[i] = rmoe_silu(gate[i]) * up[i];
		if (with_down)
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)r, (int)H, (int)F, 1.0f,
			            act + o * F, (int)F, rmoe_w_down(w, ne, H, F, e), (int)H, 0.0f,
			            out + o * H, (int)H);
	}
}

#ifdef STARPU_USE_CUDA
/* CUDA path of the expert FFN (grouped GEMM on the device): not written yet;
 * the codelets run on CPUs. */
#endif

static struct starpu_perfmodel rmoe_model_expert_ffn = RMOE_PERFMODEL("rmoe_expert_ffn_v1", rmoe_sim_cost_expert_ffn);

static struct starpu_perfmodel rmoe_model_expert_recompute = RMOE_PERFMODEL("rmoe_expert_recompute_v1", rmoe_sim_cost_expert_ffn);

struct starpu_codelet rmoe_cl_expert_ffn = {
	.name = "expert-ffn",
	.cpu_funcs = {rmoe_expert_ffn_cpu},
	.cpu_funcs_name = {"rmoe_expert_ffn_cpu"},
	RMOE_SIM_CUDA_FUNCS
	.nbuffers = 4,
	.modes = {STARPU_R, STARPU_R, STARPU_W, STARPU_W},
	.model = &rmoe_model_expert_ffn,
};

/* §3.3: a hop's intermediates rebuilt just before its backward consumes them. */
struct starpu_codelet rmoe_cl_expert_recompute = {
	.name = "recompute",
	.cpu_funcs = {rmoe_expert_ffn_cpu},
	.cpu_funcs_name = {"rmoe_expert_ffn_cpu"},
	RMOE_SIM_CUDA_FUNCS
	.nbuffers = 3,
	.modes = {STARPU_R, STARPU_R, STARPU_W},
	.model = &rmoe_model_expert_recompute,
};
