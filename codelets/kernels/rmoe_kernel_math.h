/* Per-element maths of the kernels, written once for the CPU loops and the
 * CUDA kernels: RMOE_HD marks them __host__ __device__ under nvcc and is
 * empty for the C compiler, so the CPU tests cover the same expressions the
 * GPU runs. Plain C: no StarPU, no BLAS. */
#ifndef RMOE_KERNEL_MATH_H
#define RMOE_KERNEL_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define RMOE_HD __host__ __device__
#else
#define RMOE_HD
#endif

/* Sigmoid without a branch, so that a loop over it vectorises (expert.c):
 * for g below about -88 expf(-g) overflows to +inf and 1/(1 + inf) is 0,
 * the sigmoid's value to float precision (it is under 1e-38 there); for
 * g >= 0 this is the expression of the branch it replaces, and for g < 0
 * it differs from z/(1 + z) by an ulp or two. No NaN for a finite g. */
static inline RMOE_HD float rmoe_sigmoid(float g)
{
	return 1.0f / (1.0f + expf(-g));
}

static inline RMOE_HD float rmoe_silu(float g)
{
	return g * rmoe_sigmoid(g);
}

/* SwiGLU forward of one element: act = silu(gate) * up. */
static inline RMOE_HD float rmoe_swiglu(float gate, float up)
{
	return rmoe_silu(gate) * up;
}

/* SwiGLU backward of one element, from dact: the gradients of the gate and
 * up pre-activations. silu'(g) = s*(1 + g*(1 - s)). */
static inline RMOE_HD void rmoe_swiglu_bwd(float gate, float up, float dact, float *dgate, float *dup)
{
	float s = rmoe_sigmoid(gate);
	*dup = dact * gate * s;
	*dgate = dact * up * s * (1.0f + gate * (1.0f - s));
}

/* bf16: the upper half of an IEEE binary32, rounded to nearest even (NaN
 * stays a quiet NaN). Storage only: every kernel computes in fp32. */
static inline RMOE_HD uint16_t rmoe_bf16_from_float(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

static inline RMOE_HD float rmoe_float_from_bf16(uint16_t b)
{
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* ---- the router, one token at a time (CPU loops and one GPU thread alike) ---- */

/* The top-k weights w[0..K) divided by their sum, summed in double
 * (norm_topk_prob); the CUDA router's warp calls it too. */
static inline RMOE_HD void rmoe_topk_renorm(int64_t K, float *w)
{
	double s = 0.0;
	for (int64_t k = 0; k < K; k++)
		s += w[k];
	if (s > 0.0)
		for (int64_t k = 0; k < K; k++)
			w[k] = (float)(w[k] / s);
}

/* p[0..E): logits in, softmax out (max-subtracted); idx/w: the K largest,
 * descending (an equal value never passes one already chosen, so ties keep
 * the lower expert first), divided by their sum when norm. */
static inline RMOE_HD void rmoe_router_token(int64_t E, int64_t K, int norm, float *p, int32_t *idx, float *w)
{
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
	int64_t n = 0;
	for (int64_t e = 0; e < E; e++) {
		float v = p[e];
		if (n == K && !(v > w[K - 1]))
			continue;
		int64_t j = n < K ? n++ : K - 1;
		while (j > 0 && w[j - 1] < v) {
			w[j] = w[j - 1];
			idx[j] = idx[j - 1];
			j--;
		}
		w[j] = v;
		idx[j] = (int32_t)e;
	}
	if (norm)
		rmoe_topk_renorm(K, w);
}

/* dlogits of one token from dg: dp through the renormalisation (w = p/S, so
 * dp_i = (dg_k - <dg, w>) / S), plus any gradient on p itself (dp_extra,
 * e.g. of a load-balancing loss; may be NULL), then the softmax Jacobian. */
static inline RMOE_HD void rmoe_router_dlogits_token(int64_t E, int64_t K, int norm, const float *p,
                                                     const int32_t *idx, const float *w, const float *dg,
                                                     const float *dp_extra, float *dlogits)
{
	for (int64_t e = 0; e < E; e++)
		dlogits[e] = 0.0f;
	if (norm) {
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

/* ---- the all-to-all's sort by local expert -------------------------------------- */

/* Rows of peer q's buffer before its chunk of local expert e. */
static inline RMOE_HD int64_t rmoe_sort_rows_before(const int64_t *counts, int64_t n_experts, int64_t q, int64_t e)
{
	int64_t before = 0;
	for (int64_t f = 0; f < e; f++)
		before += counts[q * n_experts + f];
	return before;
}

/* Partition weights: gate [ne][H][F] | up [ne][H][F] | down [ne][F][H]. */
static inline RMOE_HD int64_t rmoe_partition_weights_count(int64_t n_experts, int64_t hidden, int64_t ffn)
{
	return 3 * n_experts * hidden * ffn;
}

static inline RMOE_HD int64_t rmoe_w_gate_offset(int64_t n_experts, int64_t hidden, int64_t ffn, int64_t e)
{
	(void)n_experts;
	return e * hidden * ffn;
}

static inline RMOE_HD int64_t rmoe_w_up_offset(int64_t n_experts, int64_t hidden, int64_t ffn, int64_t e)
{
	return (n_experts + e) * hidden * ffn;
}

static inline RMOE_HD int64_t rmoe_w_down_offset(int64_t n_experts, int64_t hidden, int64_t ffn, int64_t e)
{
	return (2 * n_experts + e) * hidden * ffn;
}

#endif /* RMOE_KERNEL_MATH_H */
