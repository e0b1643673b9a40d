/* Router kernels (CPU): softmax over the experts, top-k choice, and the
 * backward through the renormalisation and the softmax. */
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "rmoe_kernels.h"

/* Tokens per GEMM block of the backward: bounds its dlogits scratch. */
#define RMOE_ROUTER_BWD_BLOCK 64

/* The K largest of p[0..E) into idx/w, descending; an equal value never
 * passes one already chosen, so ties keep the lower expert first. */
static void router_topk(const float *p, int64_t experts, int64_t topk, int32_t *idx, float *w)
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

void rmoe_kernel_router_fwd(int64_t T, int64_t H, int64_t E, int64_t K, int norm_topk, const float *x,
                            const float *w_router, float *probs, int32_t *topk_idx, float *topk_w)
{
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
		router_topk(p, E, K, idx, w);
		if (norm_topk) {
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
 * (dp_extra), then the softmax Jacobian. */
static void router_dlogits(int64_t E, int64_t K, int norm_topk, const float *p, const int32_t *idx,
                           const float *w, const float *dg, const float *dp_extra, float *dlogits)
{
	memset(dlogits, 0, (size_t)E * sizeof(float));
	if (norm_topk) {
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

int rmoe_kernel_router_bwd(int64_t T, int64_t H, int64_t E, int64_t K, int norm_topk, const float *x,
                           const float *w_router, const float *probs, const int32_t *topk_idx,
                           const float *topk_w, const float *dg, const float *dprobs, float *dx,
                           float *dw_router)
{
	if (T == 0) {
		memset(dw_router, 0, (size_t)(H * E) * sizeof(float));
		return 0;
	}
	int64_t block = T < RMOE_ROUTER_BWD_BLOCK ? T : RMOE_ROUTER_BWD_BLOCK;
	float *dlogits = malloc((size_t)(block * E) * sizeof(float));
	if (!dlogits)
		return -1;
	for (int64_t t0 = 0; t0 < T; t0 += block) {
		int64_t b = T - t0 < block ? T - t0 : block;
		for (int64_t i = 0; i < b; i++) {
			int64_t t = t0 + i;
			router_dlogits(E, K, norm_topk, probs + t * E, topk_idx + t * K, topk_w + t * K, dg + t * K,
			               dprobs ? dprobs + t * E : NULL, dlogits + i * E);
		}
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H, (int)E, (int)b, 1.0f, x + t0 * H,
		            (int)H, dlogits, (int)E, t0 == 0 ? 0.0f : 1.0f, dw_router, (int)E);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b, (int)H, (int)E, 1.0f, dlogits,
		            (int)E, w_router, (int)E, 1.0f, dx + t0 * H, (int)H);
	}
	free(dlogits);
	return 0;
}
