/* Expert FFN backward over one partition (grouped GEMM), in the two modes of
 * rmoe_codelets.h: pair-weighted (ring, §3.3: routing weights applied here,
 * dg produced here) and preweighted (all-to-all, shared expert). */
#include <string.h>

#include <cblas.h>

#include "kernels.h"
#include "rmoe_codelets.h"

/* SwiGLU backward in place: gate/up pre-activations in, dpre_gate/dpre_up
 * out, from dact. act = silu(g)*u; silu'(g) = s*(1 + g*(1 - s)). */
static void rmoe_swiglu_bwd(float *gate, float *up, const float *dact, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		float g = gate[i], u = up[i], s = rmoe_sigmoid(g);
		up[i] = dact[i] * g * s;
		gate[i] = dact[i] * u * s * (1.0f + g * (1.0f - s));
	}
}

/* The GEMMs after dpre: dw_gate/up = x^T dpre, dx = dpre_gate w_gate^T +
 * dpre_up w_up^T, for r rows of expert e. */
static void rmoe_expert_bwd_tail(int64_t r, int64_t H, int64_t F, const float *x, const float *dpre_gate,
                                 const float *dpre_up, const float *w_gate, const float *w_up,
                                 float *dw_gate, float *dw_up, float *dx, float beta)
{
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H, (int)F, (int)r, 1.0f, x, (int)H,
	            dpre_gate, (int)F, beta, dw_gate, (int)F);
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H, (int)F, (int)r, 1.0f, x, (int)H,
	            dpre_up, (int)F, beta, dw_up, (int)F);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)r, (int)H, (int)F, 1.0f, dpre_gate,
	            (int)F, w_gate, (int)F, 0.0f, dx, (int)H);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)r, (int)H, (int)F, 1.0f, dpre_up,
	            (int)F, w_up, (int)F, 1.0f, dx, (int)H);
}

static void rmoe_zero_expert_grads(float *dw, int64_t ne, int64_t H, int64_t F, int64_t e)
{
	size_t bytes = (size_t)(H * F) * sizeof(float);
	memset(rmoe_w_gate(dw, ne, H, F, e), 0, bytes);
	memset(rmoe_w_up(dw, ne, H, F, e), 0, bytes);
	memset(rmoe_w_down(dw, ne, H, F, e), 0, bytes);
}

/* buffers: 0 x rows (consumed), 1 dy rows, 2 weights, 3 pair_order,
 * 4 topk_w, 5 work [m*4F], 6 dx [T*H] accumulator, 7 dg, 8 dweights. On
 * return work holds dpre_gate | dpre_up | g*act | g*u, and the x rows hold
 * the rows' dx, which were added into dx at their tokens. */
static void rmoe_expert_bwd_pair_weighted(void *buffers[], const struct rmoe_expert_args *a)
{
	const int64_t H = a->hidden, F = a->ffn, ne = a->n_experts, m = a->rows;
	RMOE_CL_CHECK(rmoe_cl_nbuffers() == 9, "expert-bwd (pair-weighted): %d buffers, expected 9",
	              rmoe_cl_nbuffers());
	const int64_t n_pairs = rmoe_cl_nx(buffers[3]);
	RMOE_CL_CHECK(a->first >= 0 && a->first + m <= n_pairs,
	              "expert-bwd: slice [%lld, %lld) beyond %lld pairs", (long long)a->first,
	              (long long)(a->first + m), (long long)n_pairs);
	RMOE_CL_CHECK_NX(buffers, 0, m * H, "x rows");
	RMOE_CL_CHECK_NX(buffers, 1, m * H, "dy rows");
	RMOE_CL_CHECK_NX(buffers, 2, rmoe_partition_weights_count(ne, H, F), "weights");
	RMOE_CL_CHECK_NX(buffers, 4, n_pairs, "topk_w");
	RMOE_CL_CHECK_NX(buffers, 5, 4 * m * F, "work");
	RMOE_CL_CHECK(a->topk > 0 && n_pairs % a->topk == 0, "expert-bwd: %lld pairs, not a multiple of K=%lld",
	              (long long)n_pairs, (long long)a->topk);
	RMOE_CL_CHECK_NX(buffers, 6, n_pairs / a->topk * H, "dx");
	RMOE_CL_CHECK_NX(buffers, 7, n_pairs, "dg");
	RMOE_CL_CHECK_NX(buffers, 8, rmoe_partition_weights_count(ne, H, F), "dweights");
	float *x = (float *)STARPU_VECTOR_GET_PTR(buffers[0]);
	const float *dy = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
	float *w = (float *)STARPU_VECTOR_GET_PTR(buffers[2]);
	const int32_t *pair_order = (const int32_t *)STARPU_VECTOR_GET_PTR(buffers[3]);
	const float *topk_w = (const float *)STARPU_VECTOR_GET_PTR(buffers[4]);
	float *work = (float *)STARPU_VECTOR_GET_PTR(buffers[5]);
	float *dx = (float *)STARPU_VECTOR_GET_PTR(buffers[6]);
	float *dg = (float *)STARPU_VECTOR_GET_PTR(buffers[7]);
	float *dw = (float *)STARPU_VECTOR_GET_PTR(buffers[8]);
	float *gate = work, *up = work + m * F, *act = work + 2 * m * F, *u = work + 3 * m * F;
	const float beta = a->accumulate ? 1.0f : 0.0f;

	int64_t bad = rmoe_first_bad_pair(pair_order, a->first, m, n_pairs);
	RMOE_CL_CHECK(bad < 0, "expert-bwd: pair_order[%lld] = %d, not a pair of %lld",
	              (long long)(a->first + bad), (int)pair_order[a->first + bad], (long long)n_pairs);

	int64_t o = 0;
	for (int64_t e = 0; e < ne; o += a->rows_per_expert[e], e++) {
		const int64_t r = a->rows_per_expert[e];
		if (r == 0) {
			if (!a->accumulate)
				rmoe_zero_expert_grads(dw, ne, H, F, e);
			continue;
		}
		float *xe = x + o * H;
		const float *dye = dy + o * H;
		float *ue = u + o * F, *acte = act + o * F;
		const float *w_down = rmoe_w_down(w, ne, H, F, e);

		/* u = dy w_down^T: dL/dg of a pair is <dy, act w_down> = <u, act>. */
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)r, (int)F, (int)H, 1.0f, dye,
		            (int)H, w_down, (int)H, 0.0f, ue, (int)F);
		for (int64_t i = 0; i < r; i++) {
			int64_t p = pair_order[a->first + o + i];
			float g = topk_w[p];
			float *ui = ue + i * F, *acti = acte + i * F;
			dg[p] = rmoe_dot(ui, acti, F);
			for (int64_t j = 0; j < F; j++) {
				acti[j] *= g;
				ui[j] *= g;
			}
		}
		/* dw_down = (g*act)^T dy; then u holds dact = g*u. */
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)F, (int)H, (int)r, 1.0f, acte,
		            (int)F, dye, (int)H, beta, rmoe_w_down(dw, ne, H, F, e), (int)H);
		rmoe_swiglu_bwd(gate + o * F, up + o * F, ue, r * F);
		/* The tail reads x for the weight gradients before it writes the
		 * rows' dx over them: no separate dx rows buffer per hop. */
		rmoe_expert_bwd_tail(r, H, F, xe, gate + o * F, up + o * F, rmoe_w_gate(w, ne, H, F, e),
		                     rmoe_w_up(w, ne, H, F, e), rmoe_w_gate(dw, ne, H, F, e),
		                     rmoe_w_up(dw, ne, H, F, e), xe, beta);
	}
	for (int64_t i = 0; i < m; i++)
		cblas_saxpy((int)H, 1.0f, x + i * H, 1, dx + (int64_t)pair_order[a->first + i] / a->topk * H, 1);
}

/* buffers: 0 x, 1 dout (= g*dy), 2 weights, 3 work [m*3F], 4 dx,
 * 5 dweights. On return work holds dpre_gate | dpre_up | dact. */
static void rmoe_expert_bwd_preweighted(void *buffers[], const struct rmoe_expert_args *a)
{
	const int64_t H = a->hidden, F = a->ffn, ne = a->n_experts, m = a->rows;
	RMOE_CL_CHECK(rmoe_cl_nbuffers() == 6, "expert-bwd (preweighted): %d buffers, expected 6",
	              rmoe_cl_nbuffers());
	RMOE_CL_CHECK_NX(buffers, 0, m * H, "x rows");
	RMOE_CL_CHECK_NX(buffers, 1, m * H, "dout rows");
	RMOE_CL_CHECK_NX(buffers, 2, rmoe_partition_weights_count(ne, H, F), "weights");
	RMOE_CL_CHECK_NX(buffers, 3, 3 * m * F, "work");
	RMOE_CL_CHECK_NX(buffers, 4, m * H, "dx rows");
	RMOE_CL_CHECK_NX(buffers, 5, rmoe_partition_weights_count(ne, H, F), "dweights");
	const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
	const float *dout = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
	float *w = (float *)STARPU_VECTOR_GET_PTR(buffers[2]);
	float *work = (float *)STARPU_VECTOR_GET_PTR(buffers[3]);
	float *dx = (float *)STARPU_VECTOR_GET_PTR(buffers[4]);
	float *dw = (float *)STARPU_VECTOR_GET_PTR(buffers[5]);
	float *gate = work, *up = work + m * F, *act = work + 2 * m * F;
	const float beta = a->accumulate ? 1.0f : 0.0f;

	int64_t o = 0;
	for (int64_t e = 0; e < ne; o += a->rows_per_expert[e], e++) {
		const int64_t r = a->rows_per_expert[e];
		if (r == 0) {
			if (!a->accumulate)
				rmoe_zero_expert_grads(dw, ne, H, F, e);
			continue;
		}
		const float *xe = x + o * H, *doute = dout + o * H;
		float *acte = act + o * F;
		/* dw_down = act^T dout reads act before dact takes its place. */
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)F, (int)H, (int)r, 1.0f, acte,
		            (int)F, doute, (int)H, beta, rmoe_w_down(dw, ne, H, F, e), (int)H);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)r, (int)F, (int)H, 1.0f, doute,
		            (int)H, rmoe_w_down(w, ne, H, F, e), (int)H, 0.0f, acte, (int)F);
		rmoe_swiglu_bwd(gate + o * F, up + o * F, acte, r * F);
		rmoe_expert_bwd_tail(r, H, F, xe, gate + o * F, up + o * F, rmoe_w_gate(w, ne, H, F, e),
		                     rmoe_w_up(w, ne, H, F, e), rmoe_w_gate(dw, ne, H, F, e),
		                     rmoe_w_up(dw, ne, H, F, e), dx + o * H, beta);
	}
}

static void rmoe_expert_bwd_cpu(void *buffers[], void *cl_arg)
{
	rmoe_probe_sample();
	const struct rmoe_expert_args *a = cl_arg;
	RMOE_CL_CHECK(rmoe_expert_args_ok(a),
	              "expert-bwd: bad shape H=%lld F=%lld experts=%lld rows=%lld (or rows_per_expert)",
	              (long long)a->hidden, (long long)a->ffn, (long long)a->n_experts,
	              (long long)a->rows);
	switch (a->mode) {
	case RMOE_BWD_PAIR_WEIGHTED:
		rmoe_expert_bwd_pair_weighted(buffers, a);
		break;
	case RMOE_BWD_PREWEIGHTED:
		rmoe_expert_bwd_preweighted(buffers, a);
		break;
	default:
		RMOE_CL_CHECK(0, "expert-bwd: mode %d is not an enum rmoe_expert_bwd_mode", a->mode);
	}
}

#ifdef STARPU_USE_CUDA
/* CUDA path of the expert backward (grouped GEMM on the device): not written
 * yet; the codelet runs on CPUs. */
#endif

static struct starpu_perfmodel rmoe_model_expert_bwd = RMOE_PERFMODEL("rmoe_expert_bwd_v1", rmoe_sim_cost_expert_bwd);

/* Nine buffers in the pair-weighted mode, more than STARPU_NMAXBUFS: modes
 * come with the insertion (x rows STARPU_RW; dx and dg STARPU_RW |
 * STARPU_COMMUTE; dweights STARPU_W, or STARPU_RW when accumulate = 1). */
struct starpu_codelet rmoe_cl_expert_bwd = {
	.name = "expert-bwd",
	.cpu_funcs = {rmoe_expert_bwd_cpu},
	.cpu_funcs_name = {"rmoe_expert_bwd_cpu"},
	RMOE_SIM_CUDA_FUNCS
	.nbuffers = STARPU_VARIABLE_NBUFFERS,
	.model = &rmoe_model_expert_bwd,
};
