/* Router kernels (CPU): softmax over the experts, top-k choice, and the
 * backward through the renormalisation and the softmax; the gate of a
 * gated shared expert, a router of one sigmoid logit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "rmoe_kernels.h"

/* Tokens per GEMM block of the backward: bounds its dlogits scratch. */
#define RMOE_ROUTER_BWD_BLOCK 64

void rmoe_kernel_router_fwd(int64_t T, int64_t H, int64_t E, int64_t K, int norm_topk, const float *x,
                            const float *w_router, float *probs, int32_t *topk_idx, float *topk_w)
{
	if (T == 0)
		return;
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)E, (int)H, 1.0f, x, (int)H,
	            w_router, (int)E, 0.0f, probs, (int)E);
	for (int64_t t = 0; t < T; t++)
		rmoe_router_token(E, K, norm_topk, probs + t * E, topk_idx + t * K, topk_w + t * K);
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
			rmoe_router_dlogits_token(E, K, norm_topk, probs + t * E, topk_idx + t * K, topk_w + t * K,
			                          dg + t * K, dprobs ? dprobs + t * E : NULL, dlogits + i * E);
		}
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H, (int)E, (int)b, 1.0f, x + t0 * H,
		            (int)H, dlogits, (int)E, t0 == 0 ? 0.0f : 1.0f, dw_router, (int)E);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b, (int)H, (int)E, 1.0f, dlogits,
		            (int)E, w_router, (int)E, 1.0f, dx + t0 * H, (int)H);
	}
	free(dlogits);
	return 0;
}

void rmoe_kernel_shared_gate_fwd(int64_t T, int64_t H, const float *x, const float *w, float *s)
{
	for (int64_t t = 0; t < T; t++) {
		const float z = cblas_sdot((int)H, x + t * H, 1, w, 1);
		cblas_sscal((int)H, 1.0f / (1.0f + expf(-z)), s + t * H, 1);
	}
}

void rmoe_kernel_shared_gate_bwd(int64_t T, int64_t H, const float *x, const float *w, const float *dy, float *s,
                                 float *dx, float *dw, float *dz)
{
	for (int64_t t = 0; t < T; t++) {
		const float g = 1.0f / (1.0f + expf(-cblas_sdot((int)H, x + t * H, 1, w, 1)));
		dz[t] = cblas_sdot((int)H, dy + t * H, 1, s + t * H, 1) * g * (1.0f - g);
		for (int64_t j = 0; j < H; j++)
			s[t * H + j] = g * dy[t * H + j];
		cblas_saxpy((int)H, dz[t], w, 1, dx + t * H, 1);
	}
	if (T == 0)
		memset(dw, 0, (size_t)H * sizeof(float));
	else
		cblas_sgemv(CblasRowMajor, CblasTrans, (int)T, (int)H, 1.0f, x, (int)H, dz, 1, 0.0f, dw, 1);
}
