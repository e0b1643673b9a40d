/* CUDA kernels of the router and the dispatch map (rmoe_kernels_cuda.h):
 * the routing of every token before any row moves. Each mirrors its CPU
 * kernel in rmoe_kernels.h operation for operation; what differs is said
 * where it does. */
#include <cub/device/device_radix_sort.cuh>

#include "cuda_common.cuh"

/* ---- router -------------------------------------------------------------------------- */

/* The router on tensor cores. fp32 activations (bf16 = 0): fp32 GEMMs
 * over all tokens, as the CPU kernel. bf16 activations: bf16 GEMMs with
 * fp32 accumulation and no fp32 copy of x, which is bf16 already. The
 * fp32 weights are split into three bf16 parts, hi = bf16(w), mid =
 * bf16(w - hi), lo = bf16(w - hi - mid), whose sum is w to fp32 precision
 * (2^-24; one bf16 copy of w, 2^-8, would move the logits enough to flip
 * the top-k at near-ties): the logits are x hi + x mid + x lo, three GEMMs
 * adding into probs, and the routing keeps its fp32 contract. The
 * backward splits dlogits alike: dw_router = x^T (d_hi + d_mid + d_lo)
 * (fp32, three GEMMs), and dx += d_hi (hi + mid) + d_mid hi as one GEMM of
 * K = 3E (the terms under 2^-16 left out, far below dx's own bf16
 * rounding), added into bf16 dx with one rounding, as the CPU codelet
 * rounds. */

/* Tokens per block of the backward: fp32, bounding the fp32 dlogits
 * scratch; bf16, bounding the split dlogits (4E bf16 each: 32 MiB at
 * E = 128). The cuda-host test sets both lower to run several blocks. */
#ifndef RMOE_ROUTER_ROWS
#define RMOE_ROUTER_ROWS 4096
#endif
#ifndef RMOE_ROUTER_SPLIT_ROWS
#define RMOE_ROUTER_SPLIT_ROWS 32768
#endif

static inline int64_t router_block(int64_t T, int64_t rows)
{
	return T < rows ? T : rows;
}

/* v = hi + mid + lo in bf16, to fp32 precision (each difference exact). */
static __device__ __forceinline__ void split3(float v, rmoe_bf16_t *hi, rmoe_bf16_t *mid, rmoe_bf16_t *lo)
{
	*hi = __float2bfloat16_rn(v);
	const float r = v - __bfloat162float(*hi);
	*mid = __float2bfloat16_rn(r);
	*lo = __float2bfloat16_rn(r - __bfloat162float(*mid));
}

/* w [H][E] as rows of 3E: [hi | mid | lo] for the forward's three GEMMs,
 * or (bwd) [hi | hi | mid] for the backward's dx GEMM. */
__global__ void router_split_k(int64_t H, int64_t E, int bwd, const float *__restrict__ w,
                               rmoe_bf16_t *__restrict__ w3)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < H * E; i += (int64_t)gridDim.x * blockDim.x) {
		rmoe_bf16_t hi, mid, lo;
		split3(w[i], &hi, &mid, &lo);
		rmoe_bf16_t *row = w3 + i / E * 3 * E + i % E;
		row[0] = hi;
		row[E] = bwd ? hi : mid;
		row[2 * E] = bwd ? mid : lo;
	}
}

extern "C" size_t rmoe_cuda_router_fwd_scratch(int bf16, int64_t T, int64_t H, int64_t E)
{
	return bf16 && T > 0 ? (size_t)(3 * H * E) * sizeof(rmoe_bf16_t) : 0;
}

/* fp32: dlogits. bf16: w's rows [hi | hi | mid], then the split dlogits,
 * rows [d_lo | d_hi | d_mid | d_hi] of 4E: three blocks for dw, and the
 * last three, against [hi | hi | mid], for dx. */
extern "C" size_t rmoe_cuda_router_bwd_scratch(int bf16, int64_t T, int64_t H, int64_t E)
{
	if (T == 0)
		return 0;
	if (!bf16)
		return (size_t)(router_block(T, RMOE_ROUTER_ROWS) * E) * sizeof(float);
	return rmoe_arena_size((size_t)(3 * H * E) * sizeof(rmoe_bf16_t)) +
	       (size_t)(router_block(T, RMOE_ROUTER_SPLIT_ROWS) * 4 * E) * sizeof(rmoe_bf16_t);
}

/* ---- router ------------------------------------------------------------------------ */

/* A top-k candidate as one word: larger for a larger probability (p >= 0,
 * whose bits then order as it does), and at equal p for the lower expert,
 * the CPU kernel's order (rmoe_router_token). */
static __device__ __forceinline__ uint64_t topk_key(float p, int64_t e)
{
	uint32_t bits;
	memcpy(&bits, &p, sizeof(bits));
	return (uint64_t)bits << 32 | (uint32_t)(0xffffffffu - (uint32_t)e);
}

/* A warp per token: the softmax over its E logits (probs, in place), then
 * K rounds of a warp maximum, each taking the largest candidate below the
 * one taken before: the top-k in the CPU kernel's order, renormalised as
 * it does (a sum in double). */
__global__ void softmax_topk_k(int64_t T, int64_t E, int64_t K, int norm, float *__restrict__ probs,
                               int32_t *__restrict__ topk_idx, float *__restrict__ topk_w)
{
	const int lane = rmoe_lane();
	for (int64_t t = rmoe_warp_id(); t < T; t += rmoe_warps()) {
		float *p = probs + t * E;
		float max = -INFINITY, sum = 0.0f;
		for (int64_t e = lane; e < E; e += RMOE_WARP)
			max = fmaxf(max, p[e]);
		max = rmoe_warp_max(max);
		for (int64_t e = lane; e < E; e += RMOE_WARP) {
			p[e] = expf(p[e] - max);
			sum += p[e];
		}
		const float inv = 1.0f / rmoe_warp_sum(sum);
		for (int64_t e = lane; e < E; e += RMOE_WARP)
			p[e] *= inv;
		int32_t *idx = topk_idx + t * K;
		float *w = topk_w + t * K;
		uint64_t last = ~(uint64_t)0;
		for (int64_t k = 0; k < K; k++) {
			uint64_t best = 0;
			for (int64_t e = lane; e < E; e += RMOE_WARP) {
				const uint64_t key = topk_key(p[e], e);
				best = key < last && key > best ? key : best;
			}
			last = rmoe_warp_max(best);
			if (lane == 0) {
				idx[k] = (int32_t)(0xffffffffu - (uint32_t)last);
				w[k] = rmoe_f32_of_bits((uint32_t)(last >> 32));
			}
		}
		if (norm && lane == 0)
			rmoe_topk_renorm(K, w);
	}
}

extern "C" int rmoe_cuda_router_fwd(cudaStream_t s, cublasHandle_t b, int bf16, int64_t T, int64_t H, int64_t E,
                                    int64_t K, int norm, const void *x, const float *w_router, float *probs,
                                    int32_t *topk_idx, float *topk_w, struct rmoe_cuda_scratch scratch)
{
	if (T == 0)
		return 0;
	struct rmoe_arena a = rmoe_arena_of(scratch, s);
	rmoe_bf16_t *w3 = NULL;
	int rc = 0;
	if (bf16) {
		rc = rmoe_arena_take(&a, (size_t)(3 * H * E) * sizeof(rmoe_bf16_t), (void **)&w3);
		if (!rc) {
			RMOE_LAUNCH(router_split_k, rmoe_cuda_blocks(H * E), RMOE_CUDA_THREADS, 0, s, H, E, 0, w_router, w3);
			rc = rmoe_cuda_check("router weights split");
		}
		for (int part = 0; part < 3 && !rc; part++)
			rc = rmoe_gemm_rm(b, 0, 0, T, E, H, 1.0f, x, CUDA_R_16BF, H, w3 + part * E, CUDA_R_16BF, 3 * E,
			                  part ? 1.0f : 0.0f, probs, CUDA_R_32F, E);
	} else {
		rc = rmoe_gemm_rm(b, 0, 0, T, E, H, 1.0f, x, CUDA_R_32F, H, w_router, CUDA_R_32F, E, 0.0f, probs, CUDA_R_32F,
		                  E);
	}
	if (!rc) {
		RMOE_LAUNCH(softmax_topk_k, rmoe_cuda_warp_rows(T), RMOE_CUDA_THREADS, 0, s, T, E, K, norm, probs, topk_idx,
		            topk_w);
		rc = rmoe_cuda_check("softmax and top-k");
	}
	const int released = rmoe_arena_release(&a);
	return rc ? rc : released;
}

/* A warp per token: dlogits as the CPU kernel computes them
 * (rmoe_router_dlogits_token: through the renormalisation, plus dprobs,
 * then the softmax's Jacobian, its sums in double), written as fp32 [E]
 * or, SPLIT, as bf16 [d_lo | d_hi | d_mid | d_hi] of 4E. Each lane recomputes its
 * experts' dp rather than keep E values in registers. */
template <bool SPLIT>
__global__ void dlogits_k(int64_t T, int64_t E, int64_t K, int norm, const float *__restrict__ probs,
                          const int32_t *__restrict__ topk_idx, const float *__restrict__ topk_w,
                          const float *__restrict__ dg, const float *__restrict__ dprobs, void *__restrict__ out)
{
	const int lane = rmoe_lane();
	for (int64_t t = rmoe_warp_id(); t < T; t += rmoe_warps()) {
		const float *p = probs + t * E, *dgt = dg + t * K, *w = topk_w + t * K;
		const int32_t *idx = topk_idx + t * K;
		double s = 0.0, dg_w = 0.0;
		for (int64_t k = lane; norm && k < K; k += RMOE_WARP) {
			s += p[idx[k]];
			dg_w += (double)dgt[k] * w[k];
		}
		s = rmoe_warp_sum(s);
		dg_w = rmoe_warp_sum(dg_w);
		auto dp = [&](int64_t e) {
			float d = 0.0f;
			for (int64_t k = 0; k < K; k++)
				if (idx[k] == e)
					d += norm ? (s > 0.0 ? (float)((dgt[k] - dg_w) / s) : 0.0f) : dgt[k];
			return dprobs ? d + dprobs[t * E + e] : d;
		};
		double p_dp = 0.0;
		for (int64_t e = lane; e < E; e += RMOE_WARP)
			p_dp += (double)p[e] * dp(e);
		p_dp = rmoe_warp_sum(p_dp);
		for (int64_t e = lane; e < E; e += RMOE_WARP) {
			const float v = (float)(p[e] * (dp(e) - p_dp));
			if (SPLIT) {
				rmoe_bf16_t *o = (rmoe_bf16_t *)out + t * 4 * E + e;
				split3(v, &o[E], &o[2 * E], &o[0]);
				o[3 * E] = o[E];
			} else {
				((float *)out)[t * E + e] = v;
			}
		}
	}
}

extern "C" int rmoe_cuda_router_bwd(cudaStream_t s, cublasHandle_t b, int bf16, int64_t T, int64_t H, int64_t E,
                                    int64_t K, int norm, const void *x, const float *w_router, const float *probs,
                                    const int32_t *topk_idx, const float *topk_w, const float *dg,
                                    const float *dprobs, void *dx, float *dw_router, struct rmoe_cuda_scratch scratch)
{
	if (T == 0)
		return rmoe_cuda_ok(cudaMemsetAsync(dw_router, 0, (size_t)(H * E) * sizeof(float), s), "memset");
	const int64_t rows = router_block(T, bf16 ? RMOE_ROUTER_SPLIT_ROWS : RMOE_ROUTER_ROWS);
	struct rmoe_arena a = rmoe_arena_of(scratch, s);
	rmoe_bf16_t *w3 = NULL;
	void *dl = NULL;
	int rc = bf16 ? rmoe_arena_take(&a, (size_t)(3 * H * E) * sizeof(rmoe_bf16_t), (void **)&w3) : 0;
	if (!rc)
		rc = rmoe_arena_take(&a, (size_t)(rows * E) * (bf16 ? 4 * sizeof(rmoe_bf16_t) : sizeof(float)), &dl);
	if (!rc && bf16) {
		RMOE_LAUNCH(router_split_k, rmoe_cuda_blocks(H * E), RMOE_CUDA_THREADS, 0, s, H, E, 1, w_router, w3);
		rc = rmoe_cuda_check("router weights split");
	}
	for (int64_t t0 = 0; t0 < T && !rc; t0 += rows) {
		const int64_t n = T - t0 < rows ? T - t0 : rows;
		const float *pt = probs + t0 * E, *wt = topk_w + t0 * K, *dgt = dg + t0 * K;
		const float *dpt = dprobs ? dprobs + t0 * E : NULL;
		if (bf16)
			RMOE_LAUNCH(dlogits_k<true>, rmoe_cuda_warp_rows(n), RMOE_CUDA_THREADS, 0, s, n, E, K, norm, pt,
			            topk_idx + t0 * K, wt, dgt, dpt, dl);
		else
			RMOE_LAUNCH(dlogits_k<false>, rmoe_cuda_warp_rows(n), RMOE_CUDA_THREADS, 0, s, n, E, K, norm, pt,
			            topk_idx + t0 * K, wt, dgt, dpt, dl);
		rc = rmoe_cuda_check("router dlogits");
		/* dw_router = x^T dlogits, summed over the blocks; dx += dlogits
		 * w_router^T. */
		if (!rc && !bf16)
			rc = rmoe_gemm_rm(b, 1, 0, H, E, n, 1.0f, (const float *)x + t0 * H, CUDA_R_32F, H, dl, CUDA_R_32F, E,
			                  t0 ? 1.0f : 0.0f, dw_router, CUDA_R_32F, E);
		if (!rc && !bf16)
			rc = rmoe_gemm_rm(b, 0, 1, n, H, E, 1.0f, dl, CUDA_R_32F, E, w_router, CUDA_R_32F, E, 1.0f,
			                  (float *)dx + t0 * H, CUDA_R_32F, H);
		const rmoe_bf16_t *xt = (const rmoe_bf16_t *)x + t0 * H, *d4 = (const rmoe_bf16_t *)dl;
		for (int part = 0; part < 3 && bf16 && !rc; part++)
			rc = rmoe_gemm_rm(b, 1, 0, H, E, n, 1.0f, xt, CUDA_R_16BF, H, d4 + part * E, CUDA_R_16BF, 4 * E,
			                  t0 || part ? 1.0f : 0.0f, dw_router, CUDA_R_32F, E);
		if (!rc && bf16)
			rc = rmoe_gemm_rm(b, 0, 1, n, H, 3 * E, 1.0f, d4 + E, CUDA_R_16BF, 4 * E, w3, CUDA_R_16BF, 3 * E, 1.0f,
			                  (rmoe_bf16_t *)dx + t0 * H, CUDA_R_16BF, H);
	}
	const int released = rmoe_arena_release(&a);
	return rc ? rc : released;
}

/* ---- dispatch map ------------------------------------------------------------------- */

__global__ void iota_k(int64_t n, int32_t *v)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		v[i] = (int32_t)i;
}

/* A pair with an expert outside [0, E) is not counted: the host, which
 * checks that the counts add up to T*K, reports it. */
__global__ void count_k(int64_t P, int64_t E, const int32_t *topk_idx, int32_t *counts)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < P; i += (int64_t)gridDim.x * blockDim.x)
		if (topk_idx[i] >= 0 && topk_idx[i] < E)
			atomicAdd(counts + topk_idx[i], 1);
}

/* The radix sort's temporary storage, bounded: its extra key and value
 * buffers when it takes more than one pass, its look-back (a few bytes per
 * item) and histograms. The launcher asks cub, and allocates what exceeds
 * this (rmoe_arena_take). */
static size_t sort_temp_bound(int64_t P)
{
	return rmoe_arena_size(3 * (size_t)P * sizeof(int32_t) + ((size_t)1 << 20));
}

/* The sort's keys out and values in (pair indices), then its storage. */
extern "C" size_t rmoe_cuda_dispatch_map_scratch(int64_t P, int64_t E)
{
	(void)E;
	return P > 0 ? 2 * rmoe_arena_size((size_t)P * sizeof(int32_t)) + sort_temp_bound(P) : 0;
}

/* The stable counting sort of the CPU kernel is a stable radix sort of
 * (expert, pair) on the device: pairs ascend within each expert. */
extern "C" int rmoe_cuda_dispatch_map(cudaStream_t s, int64_t P, int64_t E, const int32_t *topk_idx,
                                      int32_t *pair_order, int32_t *counts, struct rmoe_cuda_scratch scratch)
{
	int rc = rmoe_cuda_ok(cudaMemsetAsync(counts, 0, (size_t)E * sizeof(int32_t), s), "memset");
	if (rc || P == 0)
		return rc;
	int bits = 1;
	while (bits < 31 && ((int64_t)1 << bits) < E)
		bits++;
	struct rmoe_arena a = rmoe_arena_of(scratch, s);
	int32_t *keys = NULL, *iota = NULL;
	void *temp = NULL;
	size_t temp_bytes = 0;
	rc = rmoe_cuda_ok(cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, topk_idx, keys, iota, pair_order, (int)P, 0,
	                                                  bits, s),
	                  "radix sort size");
	if (!rc && !(rc = rmoe_arena_take(&a, (size_t)P * sizeof(int32_t), (void **)&keys)) &&
	    !(rc = rmoe_arena_take(&a, (size_t)P * sizeof(int32_t), (void **)&iota)))
		rc = rmoe_arena_take(&a, temp_bytes, &temp);
	if (!rc) {
		RMOE_LAUNCH(iota_k, rmoe_cuda_blocks(P), RMOE_CUDA_THREADS, 0, s, P, iota);
		rc = rmoe_cuda_check("iota");
	}
	if (!rc)
		rc = rmoe_cuda_ok(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, topk_idx, keys, iota, pair_order, (int)P,
		                                                  0, bits, s),
		                  "radix sort");
	if (!rc) {
		RMOE_LAUNCH(count_k, rmoe_cuda_blocks(P), RMOE_CUDA_THREADS, 0, s, P, E, topk_idx, counts);
		rc = rmoe_cuda_check("expert counts");
	}
	const int released = rmoe_arena_release(&a);
	return rc ? rc : released;
}
