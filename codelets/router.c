/* Router: softmax over the experts, top-k choice, and its backward. */
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "kernels.h"
#include "rmoe_codelets.h"

/* Tokens per GEMM block of the backward: bounds its dlogits scratch. */
#define RMOE_ROUTER_BWD_BLOCK 64

static int rmoe_router_args_ok(const struct rmoe_router_args *a)
{
	return rmoe_blas_dim_ok(a->tokens) && rmoe_blas_dim_ok(a->hidden) && a->experts >= 1 &&
	       rmoe_blas_dim_ok(a->experts) && a->topk >= 1 && a->topk <= a->experts;
}

/* The K largest of p[0..E) into idx/w, descending; an equal value never
 * passes one already chosen, so ties keep the lower expert first. */
static void rmoe_router_topk(const float *p, int64_t experts, int64_t topk, int32_t *idx, float *w)
{
	int64_t n = 0;
	for (int64_t e = 0; e < experts; e++) {
		float v = p[e];
		if (n == topk && !(v > w[topk - 1]))
			continue;
		int64_t j = n < topk ? n++ : topk - 1;
		while (j > 0 && w[j - 1] < v) {
			w[j] = w[j - 1];
			idx[j] = idx[j - 1];
			j--;
		}
		w[j] = v;
		idx[j] = (int32_t)e;
	}
}

static void rmoe_router_fwd_cpu(void *buffers[], void *cl_arg)
{
	rmoe_probe_sample();
	const struct rmoe_router_args *a = cl_arg;
	RMOE_CL_CHECK(rmoe_router_args_ok(a), "router-fwd: bad shape T=%lld H=%lld E=%lld K=%lld",
	              (long long)a->tokens, (long long)a->hidden, (long long)a->experts,
	              (long long)a->topk);
	const int64_t T = a->tokens, H = a->hidden, E = a->experts, K = a->topk;
	RMOE_CL_CHECK_NX(buffers, 0, T * H, "x");
	RMOE_CL_CHECK_NX(buffers, 1, H * E, "w_router");
	RMOE_CL_CHECK_NX(buffers, 2, T * E, "probs");
	RMOE_CL_CHECK_NX(buffers, 3, T * K, "topk_idx");
	RMOE_CL_CHECK_NX(buffers, 4, T * K, "topk_w");
	const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
	const float *w_router = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
	float *probs = (float *)STARPU_VECTOR_GET_PTR(buffers[2]);
	int32_t *topk_idx = (int32_t *)STARPU_VECTOR_GET_PTR(buffers[3]);
	float *topk_w = (float *)STARPU_VECTOR_GET_PTR(buffers[4]);
	if (T == 0)
		return;

	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)E, (int)H, 1.0f, x, (int)H,
	            w_router, (int)E, 0.0f, probs, (int)E);
	for (int64_t t = 0; t < T; t++) {
		float *p = probs + t * E;
		float max = p[0];
		for (int64_t e = 1; e < E; e++)
			if (p[e] > max)
				max = p[e];
		float sum = 0.0f;
		for (int64_t e = 0; e < E; e++) {
			p[e] = expf(p[e] - max);
			sum += p[e];
		}
		float inv = 1.0f / sum;
		for (int64_t e = 0; e < E; e++)
			p[e] *= inv;

		int32_t *idx = topk_idx + t * K;
		float *w = topk_w + t * K;
		rmoe_router_topk(p, E, K, idx, w);
		if (a->norm_topk) {
			double s = 0.0;
			for (int64_t k = 0; k < K; k++)
				s += w[k];
			if (s > 0.0)
				for (int64_t k = 0; k < K; k++)
					w[k] = (float)(w[k] / s);
		}
	}
}

/* dlogits of one token from dg: dp through the renormalisation (w = p/S, so
 * dp_i = (dg_k - <dg, w>) / S), plus any gradient the caller has on p itself
 * (dp_extra, e.g. of a load-balancing loss), then the softmax Jacobian. */
static void rmoe_router_dlogits(const struct rmoe_router_args *a, const float *p, const int32_t *idx,
                                const float *w, const float *dg, const float *dp_extra,
                                float *dlogits)
{
	const int64_t E = a->experts, K = a->topk;
	memset(dlogits, 0, (size_t)E * sizeof(float));
	if (a->norm_topk) {
		double s = 0.0, dg_w = 0.0;
		for (int64_t k = 0; k < K; k++) {
			s += p[idx[k]];
			dg_w += (double)dg[k] * w[k];
		}
		if (s > 0.0)
			for (int64_t k = 0; k < K; k++)
				dlogits[idx[k]] += (float)((dg[k] - dg_w) / s);
	} else {
		for (int64_t k = 0; k < K; k++)
			dlogits[idx[k]] += dg[k];
	}
	if (dp_extra)
		for (int64_t e = 0; e < E; e++)
			dlogits[e] += dp_extra[e];
	double p_dp = 0.0;
	for (int64_t e = 0; e < E; e++)
		p_dp += (double)p[e] * dlogits[e];
	for (int64_t e = 0; e < E; e++)
		dlogits[e] = (float)(p[e] * (dlogits[e] - p_dp));
}

static void rmoe_router_bwd_cpu(void *buffers[], void *cl_arg)
{
	rmoe_probe_sample();
	const struct rmoe_router_args *a = cl_arg;
	RMOE_CL_CHECK(rmoe_router_args_ok(a), "router-bwd: bad shape T=%lld H=%lld E=%lld K=%lld",
	              (long long)a->tokens, (long long)a->hidden, (long long)a->experts,
	              (long long)a->topk);
	const int64_t T = a->tokens, H = a->hidden, E = a->experts, K = a->topk;
	RMOE_CL_CHECK_NX(buffers, 0, T * H, "x");
	RMOE_CL_CHECK_NX(buffers, 1, H * E, "w_router");
	RMOE_CL_CHECK_NX(buffers, 2, T * E, "probs");
	RMOE_CL_CHECK_NX(buffers, 3, T * K, "topk_idx");
	RMOE_CL_CHECK_NX(buffers, 4, T * K, "topk_w");
	RMOE_CL_CHECK_NX(buffers, 5, T * K, "dg");
	RMOE_CL_CHECK_NX(buffers, 6, T * H, "dx");
	RMOE_CL_CHECK_NX(buffers, 7, H * E, "dw_router");
	const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
	const float *w_router = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
	const float *probs = (const float *)STARPU_VECTOR_GET_PTR(buffers[2]);
	const int32_t *topk_idx = (const int32_t *)STARPU_VECTOR_GET_PTR(buffers[3]);
	const float *topk_w = (const float *)STARPU_VECTOR_GET_PTR(buffers[4]);
	const float *dg = (const float *)STARPU_VECTOR_GET_PTR(buffers[5]);
	float *dx = (float *)STARPU_VECTOR_GET_PTR(buffers[6]);
	float *dw_router = (float *)STARPU_VECTOR_GET_PTR(buffers[7]);
	const float *dprobs = NULL;
	if (STARPU_TASK_GET_NBUFFERS(starpu_task_get_current()) > 8) {
		RMOE_CL_CHECK_NX(buffers, 8, T * E, "dprobs");
		dprobs = (const float *)STARPU_VECTOR_GET_PTR(buffers[8]);
	}

	if (T == 0) {
		memset(dw_router, 0, (size_t)(H * E) * sizeof(float));
		return;
	}
	for (int64_t i = 0; i < T * K; i++)
		RMOE_CL_CHECK(topk_idx[i] >= 0 && topk_idx[i] < E,
		              "router-bwd: topk_idx[%lld] = %d, not an expert of %lld", (long long)i,
		              (int)topk_idx[i], (long long)E);

	int64_t block = T < RMOE_ROUTER_BWD_BLOCK ? T : RMOE_ROUTER_BWD_BLOCK;
	float *dlogits = malloc((size_t)(block * E) * sizeof(float));
	RMOE_CL_CHECK(dlogits != NULL, "router-bwd: no memory for %lld x %lld dlogits",
	              (long long)block, (long long)E);
	for (int64_t t0 = 0; t0 < T; t0 += block) {
		int64_t b = T - t0 < block ? T - t0 : block;
		for (int64_t i = 0; i < b; i++) {
			int64_t t = t0 + i;
			rmoe_router_dlogits(a, probs + t * E, topk_idx + t * K, topk_w + t * K, dg + t * K,
			                    dprobs ? dprobs + t * E : NULL, dlogits + i * E);
		}
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H, (int)E, (int)b, 1.0f,
		            x + t0 * H, (int)H, dlogits, (int)E, t0 == 0 ? 0.0f : 1.0f, dw_router, (int)E);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b, (int)H, (int)E, 1.0f, dlogits,
		            (int)E, w_router, (int)E, 1.0f, dx + t0 * H, (int)H);
	}
	free(dlogits);
}

#ifdef STARPU_USE_CUDA
/* CUDA kernels of the router: not written yet; the codelets run on CPUs. */
#endif

static struct starpu_perfmodel rmoe_model_router_fwd = RMOE_PERFMODEL("rmoe_router_fwd_v1", rmoe_sim_cost_router_fwd);

static struct starpu_perfmodel rmoe_model_router_bwd = RMOE_PERFMODEL("rmoe_router_bwd_v1", rmoe_sim_cost_router_bwd);

struct starpu_codelet rmoe_cl_router_fwd = {
	.name = "router-fwd",
	.cpu_funcs = {rmoe_router_fwd_cpu},
	.cpu_funcs_name = {"rmoe_router_fwd_cpu"},
	RMOE_SIM_CUDA_FUNCS
	.nbuffers = 5,
	.modes = {STARPU_R, STARPU_R, STARPU_W, STARPU_W, STARPU_W},
	.model = &rmoe_model_router_fwd,
};

struct starpu_codelet rmoe_cl_router_bwd = {
	.name = "router-bwd",
	.cpu_funcs = {rmoe_router_bwd_cpu},
	.cpu_funcs_name = {"rmoe_router_bwd_cpu"},
	RMOE_SIM_CUDA_FUNCS
	.nbuffers = STARPU_VARIABLE_NBUFFERS, /* 8, or 9 with dprobs */
	.model = &rmoe_model_router_bwd,
};
