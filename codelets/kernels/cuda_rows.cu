/* CUDA kernels of the router, the dispatch map, the row operations of a
 * slice of the pair order and the small ops (rmoe_kernels_cuda.h). Each
 * mirrors its CPU kernel in rmoe_kernels.h operation for operation; what
 * differs is said where it does. */
#include <cub/device/device_radix_sort.cuh>

#include "cuda_common.cuh"

/* ---- element conversions --------------------------------------------------------- */

template <typename S, typename D> __global__ void convert_k(int64_t n, const S *src, D *dst)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		rmoe_st(dst, i, rmoe_ld(src, i));
}

/* dst += src (float into T) */
template <typename S, typename T> __global__ void accumulate_k(int64_t n, const S *src, T *dst)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		rmoe_st(dst, i, rmoe_ld(dst, i) + rmoe_ld(src, i));
}

/* Rows per block of the router: bf16 rows are converted to an fp32 scratch
 * of this many rows (32 MiB at H = 2048), not of all T, since the router's
 * weights are fp32 and cublasGemmEx takes one type for A and B; the
 * backward's dlogits and bf16 dx go through block-sized scratch alike. */
#define RMOE_ROUTER_ROWS 4096

/* The fp32 rows [t0, t0 + n) of x: x itself when fp32, else converted into
 * scratch. */
static int router_rows(cudaStream_t s, int bf16, int64_t t0, int64_t n, int64_t H, const void *x, float *scratch,
                       const float **f)
{
	if (!bf16) {
		*f = (const float *)x + t0 * H;
		return 0;
	}
	RMOE_LAUNCH(convert_k, rmoe_cuda_blocks(n * H), RMOE_CUDA_THREADS, 0, s, n * H, (const rmoe_bf16_t *)x + t0 * H,
	            scratch);
	*f = scratch;
	return rmoe_cuda_check("bf16 to fp32");
}

static inline int64_t router_block(int64_t T)
{
	return T < RMOE_ROUTER_ROWS ? T : RMOE_ROUTER_ROWS;
}

extern "C" size_t rmoe_cuda_router_fwd_scratch(int bf16, int64_t T, int64_t H, int64_t E)
{
	(void)E;
	return bf16 && T > 0 ? (size_t)(router_block(T) * H) * sizeof(float) : 0;
}

/* dlogits, and for bf16 the fp32 rows of x and of dx. */
extern "C" size_t rmoe_cuda_router_bwd_scratch(int bf16, int64_t T, int64_t H, int64_t E)
{
	if (T == 0)
		return 0;
	const int64_t rows = router_block(T);
	const size_t dlogits = (size_t)(rows * E) * sizeof(float), xrows = (size_t)(rows * H) * sizeof(float);
	return bf16 ? rmoe_arena_size(dlogits) + rmoe_arena_size(xrows) + xrows : dlogits;
}

/* ---- router ------------------------------------------------------------------------ */

/* One thread per token: softmax, top-k and renormalisation, as the CPU
 * kernel (the same rmoe_router_token). */
__global__ void softmax_topk_k(int64_t T, int64_t E, int64_t K, int norm, float *probs, int32_t *topk_idx,
                               float *topk_w)
{
	for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < T; t += (int64_t)gridDim.x * blockDim.x)
		rmoe_router_token(E, K, norm, probs + t * E, topk_idx + t * K, topk_w + t * K);
}

extern "C" int rmoe_cuda_router_fwd(cudaStream_t s, cublasHandle_t b, int bf16, int64_t T, int64_t H, int64_t E,
                                    int64_t K, int norm, const void *x, const float *w_router, float *probs,
                                    int32_t *topk_idx, float *topk_w, struct rmoe_cuda_scratch scratch)
{
	if (T == 0)
		return 0;
	const int64_t rows = router_block(T);
	struct rmoe_arena a = rmoe_arena_of(scratch, s);
	float *xs = NULL;
	int rc = bf16 ? rmoe_arena_take(&a, (size_t)(rows * H) * sizeof(float), (void **)&xs) : 0;
	for (int64_t t0 = 0; t0 < T && !rc; t0 += rows) {
		const int64_t n = T - t0 < rows ? T - t0 : rows;
		const float *xf;
		rc = router_rows(s, bf16, t0, n, H, x, xs, &xf);
		if (!rc)
			rc = rmoe_gemm_rm(b, 0, 0, n, E, H, 1.0f, xf, CUDA_R_32F, H, w_router, CUDA_R_32F, E, 0.0f,
			                  probs + t0 * E, CUDA_R_32F, E);
	}
	if (!rc) {
		RMOE_LAUNCH(softmax_topk_k, rmoe_cuda_blocks(T), RMOE_CUDA_THREADS, 0, s, T, E, K, norm, probs, topk_idx,
		            topk_w);
		rc = rmoe_cuda_check("softmax and top-k");
	}
	const int released = rmoe_arena_release(&a);
	return rc ? rc : released;
}

/* One thread per token: dlogits, as the CPU kernel (rmoe_router_dlogits_token). */
__global__ void dlogits_k(int64_t T, int64_t E, int64_t K, int norm, const float *probs, const int32_t *topk_idx,
                          const float *topk_w, const float *dg, const float *dprobs, float *dlogits)
{
	for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < T; t += (int64_t)gridDim.x * blockDim.x)
		rmoe_router_dlogits_token(E, K, norm, probs + t * E, topk_idx + t * K, topk_w + t * K, dg + t * K,
		                          dprobs ? dprobs + t * E : NULL, dlogits + t * E);
}

extern "C" int rmoe_cuda_router_bwd(cudaStream_t s, cublasHandle_t b, int bf16, int64_t T, int64_t H, int64_t E,
                                    int64_t K, int norm, const void *x, const float *w_router, const float *probs,
                                    const int32_t *topk_idx, const float *topk_w, const float *dg,
                                    const float *dprobs, void *dx, float *dw_router, struct rmoe_cuda_scratch scratch)
{
	if (T == 0)
		return rmoe_cuda_ok(cudaMemsetAsync(dw_router, 0, (size_t)(H * E) * sizeof(float), s), "memset");
	const int64_t rows = router_block(T);
	struct rmoe_arena a = rmoe_arena_of(scratch, s);
	float *xs = NULL, *dlogits = NULL, *dxs = NULL;
	int rc = rmoe_arena_take(&a, (size_t)(rows * E) * sizeof(float), (void **)&dlogits);
	if (!rc && bf16 && !(rc = rmoe_arena_take(&a, (size_t)(rows * H) * sizeof(float), (void **)&xs)))
		rc = rmoe_arena_take(&a, (size_t)(rows * H) * sizeof(float), (void **)&dxs);
	for (int64_t t0 = 0; t0 < T && !rc; t0 += rows) {
		const int64_t n = T - t0 < rows ? T - t0 : rows;
		RMOE_LAUNCH(dlogits_k, rmoe_cuda_blocks(n), RMOE_CUDA_THREADS, 0, s, n, E, K, norm, probs + t0 * E,
		            topk_idx + t0 * K, topk_w + t0 * K, dg + t0 * K, dprobs ? dprobs + t0 * E : NULL, dlogits);
		rc = rmoe_cuda_check("router dlogits");
		const float *xf;
		if (!rc)
			rc = router_rows(s, bf16, t0, n, H, x, xs, &xf);
		/* dw_router = x^T dlogits, summed over the blocks; dx += dlogits
		 * w_router^T (through the fp32 scratch when dx is bf16: the GEMM's
		 * C is of A's type). */
		if (!rc)
			rc = rmoe_gemm_rm(b, 1, 0, H, E, n, 1.0f, xf, CUDA_R_32F, H, dlogits, CUDA_R_32F, E, t0 ? 1.0f : 0.0f,
			                  dw_router, CUDA_R_32F, E);
		if (!rc && !bf16)
			rc = rmoe_gemm_rm(b, 0, 1, n, H, E, 1.0f, dlogits, CUDA_R_32F, E, w_router, CUDA_R_32F, E, 1.0f,
			                  (float *)dx + t0 * H, CUDA_R_32F, H);
		if (!rc && bf16)
			rc = rmoe_gemm_rm(b, 0, 1, n, H, E, 1.0f, dlogits, CUDA_R_32F, E, w_router, CUDA_R_32F, E, 0.0f, dxs,
			                  CUDA_R_32F, H);
		if (!rc && bf16) {
			RMOE_LAUNCH(accumulate_k, rmoe_cuda_blocks(n * H), RMOE_CUDA_THREADS, 0, s, n * H, (const float *)dxs,
			            (rmoe_bf16_t *)dx + t0 * H);
			rc = rmoe_cuda_check("router dx");
		}
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

/* ---- rows of a slice of the pair order ------------------------------------------------ */

/* A block per row, its threads along H. */
template <typename T>
__global__ void gather_k(int64_t H, int64_t K, int64_t first, int64_t count, const T *src, const int32_t *order,
                         const float *w, T *rows)
{
	for (int64_t i = blockIdx.x; i < count; i += gridDim.x) {
		const int64_t p = order[first + i];
		const float g = w ? w[p] : 1.0f;
		const T *sr = src + p / K * H;
		T *r = rows + i * H;
		for (int64_t j = threadIdx.x; j < H; j += blockDim.x)
			rmoe_st(r, j, w ? g * rmoe_ld(sr, j) : rmoe_ld(sr, j));
	}
}

/* Two pairs of one token may be in one slice (two of its experts in one
 * partition): these additions are atomic, so their order, and the last
 * bits of the sum, may differ from run to run on a device. */
template <typename T>
__global__ void scatter_add_k(int64_t H, int64_t K, int64_t first, int64_t count, const T *rows,
                              const int32_t *order, const float *w, T *dst)
{
	for (int64_t i = blockIdx.x; i < count; i += gridDim.x) {
		const int64_t p = order[first + i];
		const float g = w ? w[p] : 1.0f;
		const T *r = rows + i * H;
		for (int64_t j = threadIdx.x; j < H; j += blockDim.x)
			rmoe_add(dst, p / K * H + j, g * rmoe_ld(r, j));
	}
}

/* The deterministic additions, in three steps without atomics. First
 * index[p] = the slice position of pair p (-1, set before, elsewhere). */
__global__ void rows_index_k(int64_t first, int64_t count, const int32_t *order, int32_t *index)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
		index[order[first + i]] = (int32_t)i;
}

/* Then, one thread per token, its K entries sorted by slice position, the
 * pairs outside the slice (-1, the largest unsigned) last: the order in
 * which the CPU kernel adds the token's rows. */
__global__ void rows_order_k(int64_t ntok, int64_t K, int32_t *index)
{
	for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < ntok; t += (int64_t)gridDim.x * blockDim.x) {
		int32_t *v = index + t * K;
		for (int64_t i = 1; i < K; i++) {
			const int32_t x = v[i];
			int64_t j = i;
			for (; j > 0 && (uint32_t)v[j - 1] > (uint32_t)x; j--)
				v[j] = v[j - 1];
			v[j] = x;
		}
	}
}

/* Last, a block per token, its threads along H: the token's rows added in
 * that order to an fp32 sum of its dst row, stored once. */
template <typename T>
__global__ void rows_add_ordered_k(int64_t ntok, int64_t H, int64_t K, int64_t first, const T *rows,
                                   const int32_t *order, const float *w, const int32_t *index, T *dst)
{
	for (int64_t t = blockIdx.x; t < ntok; t += gridDim.x) {
		const int32_t *at = index + t * K;
		if (at[0] < 0)
			continue;
		for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
			float acc = rmoe_ld(dst, t * H + j);
			for (int64_t k = 0; k < K && at[k] >= 0; k++) {
				const float v = rmoe_ld(rows, at[k] * H + j);
				acc = rmoe_add_rn(acc, w ? rmoe_mul_rn(w[order[first + at[k]]], v) : v);
			}
			rmoe_st(dst, t * H + j, acc);
		}
	}
}

template <typename T>
static int rows_add(cudaStream_t s, int64_t H, int64_t K, int64_t n_pairs, int64_t first, int64_t count,
                    const T *rows, const int32_t *order, const float *w, T *dst, int32_t *index)
{
	if (!index) {
		RMOE_LAUNCH(scatter_add_k, rmoe_cuda_rows(count), RMOE_CUDA_THREADS, 0, s, H, K, first, count, rows, order, w,
		            dst);
		return rmoe_cuda_check("scatter-add");
	}
	const int64_t ntok = n_pairs / K;
	int rc = rmoe_cuda_ok(cudaMemsetAsync(index, 0xff, (size_t)n_pairs * sizeof(int32_t), s), "memset");
	if (!rc) {
		RMOE_LAUNCH(rows_index_k, rmoe_cuda_blocks(count), RMOE_CUDA_THREADS, 0, s, first, count, order, index);
		rc = rmoe_cuda_check("scatter-add index");
	}
	if (!rc) {
		RMOE_LAUNCH(rows_order_k, rmoe_cuda_blocks(ntok), RMOE_CUDA_THREADS, 0, s, ntok, K, index);
		rc = rmoe_cuda_check("scatter-add order");
	}
	if (!rc) {
		RMOE_LAUNCH(rows_add_ordered_k, rmoe_cuda_rows(ntok), RMOE_CUDA_THREADS, 0, s, ntok, H, K, first, rows, order,
		            w, index, dst);
		rc = rmoe_cuda_check("scatter-add in order");
	}
	return rc;
}

int rmoe_cuda_rows_add(cudaStream_t s, int bf16, int64_t H, int64_t K, int64_t n_pairs, int64_t first, int64_t count,
                       const void *rows, const int32_t *order, const float *w, void *dst, int32_t *index)
{
	if (count == 0)
		return 0;
	if (bf16)
		return rows_add(s, H, K, n_pairs, first, count, (const rmoe_bf16_t *)rows, order, w, (rmoe_bf16_t *)dst,
		                index);
	return rows_add(s, H, K, n_pairs, first, count, (const float *)rows, order, w, (float *)dst, index);
}

extern "C" size_t rmoe_cuda_rows_add_scratch(int deterministic, int64_t n_pairs)
{
	return deterministic && n_pairs > 0 ? (size_t)n_pairs * sizeof(int32_t) : 0;
}

template <typename T>
__global__ void unpermute_bwd_k(int64_t H, int64_t K, int64_t first, int64_t count, const T *dy, const T *back,
                                const int32_t *order, const float *w, T *dout, float *dg)
{
	for (int64_t i = blockIdx.x; i < count; i += gridDim.x) {
		const int64_t p = order[first + i];
		const T *dyt = dy + p / K * H, *bi = back + i * H;
		T *d = dout + i * H;
		float acc = 0.0f;
		for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
			rmoe_st(d, j, w[p] * rmoe_ld(dyt, j));
			acc += rmoe_ld(dyt, j) * rmoe_ld(bi, j);
		}
		acc = rmoe_block_sum(acc);
		if (threadIdx.x == 0)
			dg[p] = acc;
	}
}

extern "C" int rmoe_cuda_gather(cudaStream_t s, int bf16, int64_t H, int64_t K, int64_t first, int64_t count,
                                const void *src, const int32_t *order, const float *w, void *rows)
{
	if (count == 0)
		return 0;
	if (bf16)
		RMOE_LAUNCH(gather_k, rmoe_cuda_rows(count), RMOE_CUDA_THREADS, 0, s, H, K, first, count,
		            (const rmoe_bf16_t *)src, order, w, (rmoe_bf16_t *)rows);
	else
		RMOE_LAUNCH(gather_k, rmoe_cuda_rows(count), RMOE_CUDA_THREADS, 0, s, H, K, first, count, (const float *)src,
		            order, w, (float *)rows);
	return rmoe_cuda_check("gather");
}

extern "C" int rmoe_cuda_scatter_add(cudaStream_t s, int bf16, int64_t H, int64_t K, int64_t n_pairs, int64_t first,
                                     int64_t count, const void *rows, const int32_t *order, const float *w, void *dst,
                                     int deterministic, struct rmoe_cuda_scratch scratch)
{
	if (count == 0)
		return 0;
	struct rmoe_arena a = rmoe_arena_of(scratch, s);
	int32_t *index = NULL;
	int rc = deterministic ? rmoe_arena_take(&a, (size_t)n_pairs * sizeof(int32_t), (void **)&index) : 0;
	if (!rc)
		rc = rmoe_cuda_rows_add(s, bf16, H, K, n_pairs, first, count, rows, order, w, dst, index);
	const int released = rmoe_arena_release(&a);
	return rc ? rc : released;
}

extern "C" int rmoe_cuda_unpermute_bwd(cudaStream_t s, int bf16, int64_t H, int64_t K, int64_t first,
                                       int64_t count, const void *dy, const void *back, const int32_t *order,
                                       const float *w, void *dout, float *dg)
{
	if (count == 0)
		return 0;
	if (bf16)
		RMOE_LAUNCH(unpermute_bwd_k, rmoe_cuda_rows(count), RMOE_CUDA_THREADS, 0, s, H, K, first, count,
		            (const rmoe_bf16_t *)dy, (const rmoe_bf16_t *)back, order, w, (rmoe_bf16_t *)dout, dg);
	else
		RMOE_LAUNCH(unpermute_bwd_k, rmoe_cuda_rows(count), RMOE_CUDA_THREADS, 0, s, H, K, first, count,
		            (const float *)dy, (const float *)back, order, w, (float *)dout, dg);
	return rmoe_cuda_check("unpermute-bwd");
}

/* ---- the shared expert's gate ------------------------------------------------------------ */

/* One block per token, as unpermute_bwd_k: the logit's dot product over the
 * block, then the row scaled. */
template <typename T> __global__ void shared_gate_fwd_k(int64_t T_, int64_t H, const T *x, const float *w, T *sh)
{
	for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
		const T *xt = x + t * H;
		T *st = sh + t * H;
		float z = 0.0f;
		for (int64_t j = threadIdx.x; j < H; j += blockDim.x)
			z += rmoe_ld(xt, j) * w[j];
		const float g = 1.0f / (1.0f + expf(-rmoe_block_sum(z)));
		for (int64_t j = threadIdx.x; j < H; j += blockDim.x)
			rmoe_st(st, j, g * rmoe_ld(st, j));
	}
}

/* One block per token: g and dz, the gated dy over sh, dx += dz w (a row
 * per block: no atomics); dz kept for dw. */
template <typename T>
__global__ void shared_gate_bwd_k(int64_t T_, int64_t H, const T *x, const float *w, const T *dy, T *sh, T *dx,
                                  float *dz)
{
	for (int64_t t = blockIdx.x; t < T_; t += gridDim.x) {
		const T *xt = x + t * H, *dyt = dy + t * H;
		T *st = sh + t * H, *dxt = dx + t * H;
		float z = 0.0f, q = 0.0f;
		for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
			z += rmoe_ld(xt, j) * w[j];
			q += rmoe_ld(dyt, j) * rmoe_ld(st, j);
		}
		z = rmoe_block_sum(z);
		q = rmoe_block_sum(q);
		const float g = 1.0f / (1.0f + expf(-z)), d = q * g * (1.0f - g);
		for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
			rmoe_st(st, j, g * rmoe_ld(dyt, j));
			rmoe_st(dxt, j, rmoe_ld(dxt, j) + d * w[j]);
		}
		if (threadIdx.x == 0)
			dz[t] = d;
	}
}

/* dw[j] = sum_t dz[t] x[t, j], in token order: one thread per column. */
template <typename T> __global__ void shared_gate_dw_k(int64_t T_, int64_t H, const T *x, const float *dz, float *dw)
{
	for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < H; j += (int64_t)gridDim.x * blockDim.x) {
		float acc = 0.0f;
		for (int64_t t = 0; t < T_; t++)
			acc += dz[t] * rmoe_ld(x, t * H + j);
		dw[j] = acc;
	}
}

extern "C" size_t rmoe_cuda_shared_gate_bwd_scratch(int64_t T)
{
	return T > 0 ? (size_t)T * sizeof(float) : 0;
}

extern "C" int rmoe_cuda_shared_gate_fwd(cudaStream_t s, int bf16, int64_t T, int64_t H, const void *x, const float *w,
                                         void *sh)
{
	if (T == 0)
		return 0;
	if (bf16)
		RMOE_LAUNCH(shared_gate_fwd_k, rmoe_cuda_rows(T), RMOE_CUDA_THREADS, 0, s, T, H, (const rmoe_bf16_t *)x, w,
		            (rmoe_bf16_t *)sh);
	else
		RMOE_LAUNCH(shared_gate_fwd_k, rmoe_cuda_rows(T), RMOE_CUDA_THREADS, 0, s, T, H, (const float *)x, w,
		            (float *)sh);
	return rmoe_cuda_check("shared-gate-fwd");
}

extern "C" int rmoe_cuda_shared_gate_bwd(cudaStream_t s, int bf16, int64_t T, int64_t H, const void *x, const float *w,
                                         const void *dy, void *sh, void *dx, float *dw, struct rmoe_cuda_scratch scratch)
{
	if (T == 0)
		return rmoe_cuda_ok(cudaMemsetAsync(dw, 0, (size_t)H * sizeof(float), s), "memset");
	struct rmoe_arena a = rmoe_arena_of(scratch, s);
	float *dz = NULL;
	int rc = rmoe_arena_take(&a, (size_t)T * sizeof(float), (void **)&dz);
	if (!rc) {
		if (bf16) {
			RMOE_LAUNCH(shared_gate_bwd_k, rmoe_cuda_rows(T), RMOE_CUDA_THREADS, 0, s, T, H, (const rmoe_bf16_t *)x,
			            w, (const rmoe_bf16_t *)dy, (rmoe_bf16_t *)sh, (rmoe_bf16_t *)dx, dz);
			RMOE_LAUNCH(shared_gate_dw_k, rmoe_cuda_blocks(H), RMOE_CUDA_THREADS, 0, s, T, H, (const rmoe_bf16_t *)x,
			            (const float *)dz, dw);
		} else {
			RMOE_LAUNCH(shared_gate_bwd_k, rmoe_cuda_rows(T), RMOE_CUDA_THREADS, 0, s, T, H, (const float *)x, w,
			            (const float *)dy, (float *)sh, (float *)dx, dz);
			RMOE_LAUNCH(shared_gate_dw_k, rmoe_cuda_blocks(H), RMOE_CUDA_THREADS, 0, s, T, H, (const float *)x,
			            (const float *)dz, dw);
		}
		rc = rmoe_cuda_check("shared-gate-bwd");
	}
	const int released = rmoe_arena_release(&a);
	return rc ? rc : released;
}

/* ---- small ops -------------------------------------------------------------------------- */

extern "C" int rmoe_cuda_accumulate(cudaStream_t s, int bf16, int64_t n, const void *src, void *dst)
{
	if (n == 0)
		return 0;
	if (bf16)
		RMOE_LAUNCH(accumulate_k, rmoe_cuda_blocks(n), RMOE_CUDA_THREADS, 0, s, n, (const rmoe_bf16_t *)src,
		            (rmoe_bf16_t *)dst);
	else
		RMOE_LAUNCH(accumulate_k, rmoe_cuda_blocks(n), RMOE_CUDA_THREADS, 0, s, n, (const float *)src, (float *)dst);
	return rmoe_cuda_check("accumulate");
}

extern "C" int rmoe_cuda_zero(cudaStream_t s, size_t elsize, int64_t n, void *dst)
{
	/* bf16 and fp32 zero are all-zero bits. */
	return rmoe_cuda_ok(cudaMemsetAsync(dst, 0, (size_t)n * elsize, s), "memset");
}

/* Chunk (q, e) moves as one device-to-device copy, in the CPU kernel's
 * order. */
extern "C" int rmoe_cuda_sort_chunks(cudaStream_t s, size_t elsize, int64_t H, int64_t n_peers, int64_t ne,
                                     const int64_t *counts, int sort, void *const *peer, void *sorted)
{
	int64_t at = 0;
	int rc = 0;
	for (int64_t e = 0; e < ne && !rc; e++)
		for (int64_t q = 0; q < n_peers && !rc; q++) {
			const int64_t *c = counts + q * ne;
			if (!peer[q])
				continue;
			char *chunk = (char *)peer[q] + (size_t)(rmoe_sort_rows_before(counts, ne, q, e) * H) * elsize;
			char *there = (char *)sorted + (size_t)(at * H) * elsize;
			size_t bytes = (size_t)(c[e] * H) * elsize;
			if (bytes)
				rc = rmoe_cuda_ok(cudaMemcpyAsync(sort ? there : chunk, sort ? chunk : there, bytes,
				                                  cudaMemcpyDeviceToDevice, s),
				                  "chunk copy");
			at += c[e];
		}
	return rc;
}
