/* CUDA kernels of the row operations of a slice of the pair order and the
 * small ops (rmoe_kernels_cuda.h); the router and the dispatch map are
 * cuda_router.cu's. Each mirrors its CPU kernel in rmoe_kernels.h
 * operation for operation; what differs is said where it does. */
#include "cuda_common.cuh"

/* ---- elementwise ------------------------------------------------------------------- */

/* dst += src (float into T) */
template <typename S, typename T> __global__ void accumulate_k(int64_t n, const S *src, T *dst)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		rmoe_st(dst, i, rmoe_ld(dst, i) + rmoe_ld(src, i));
}

/* ---- rows of a slice of the pair order ------------------------------------------------ */

/* A warp per row of the slice, its lanes along H, 16 bytes per access
 * where H and the buffers allow (rmoe_vec_ok; else V = 1). */
template <typename T, int V>
__global__ void gather_k(rmoe_width<V>, int64_t H, int64_t K, int64_t first, int64_t count, const T *__restrict__ src,
                         const int32_t *__restrict__ order, const float *__restrict__ w, T *__restrict__ rows)
{
	for (int64_t i = rmoe_warp_id(); i < count; i += rmoe_warps()) {
		const int64_t p = order[first + i];
		const T *sr = src + p / K * H;
		T *r = rows + i * H;
		if (!w) {
			for (int64_t j = rmoe_lane() * V; j < H; j += RMOE_WARP * V)
				rmoe_io<T, V>::cp(r + j, sr + j);
			continue;
		}
		const float g = w[p];
		for (int64_t j = rmoe_lane() * V; j < H; j += RMOE_WARP * V) {
			float v[V];
			rmoe_io<T, V>::ld(sr + j, v);
			for (int q = 0; q < V; q++)
				v[q] = g * v[q];
			rmoe_io<T, V>::st(r + j, v);
		}
	}
}

/* The scatter-add without atomics (two pairs of one token may be in one
 * slice: two of its experts in one partition), in three steps. First
 * index[p] = the slice position of pair p (-1, set before, elsewhere). */
__global__ void rows_index_k(int64_t first, int64_t count, const int32_t *__restrict__ order,
                             int32_t *__restrict__ index)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
		index[order[first + i]] = (int32_t)i;
}

/* Then, one thread per token, its K entries sorted by slice position, the
 * pairs outside the slice (-1, the largest unsigned) last: the order in
 * which the CPU kernel adds the token's rows. */
__global__ void rows_order_k(int64_t ntok, int64_t K, int32_t *__restrict__ index)
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

/* Last, a warp per token, its lanes along H: the token's rows added in
 * that order to an fp32 sum of its dst row, each addition and product
 * rounded as written (rmoe_add_rn), stored once. */
template <typename T, int V>
__global__ void rows_add_ordered_k(rmoe_width<V>, int64_t ntok, int64_t H, int64_t K, int64_t first,
                                   const T *__restrict__ rows, const int32_t *__restrict__ order,
                                   const float *__restrict__ w, const int32_t *__restrict__ index, T *__restrict__ dst)
{
	for (int64_t t = rmoe_warp_id(); t < ntok; t += rmoe_warps()) {
		const int32_t *at = index + t * K;
		if (at[0] < 0)
			continue;
		for (int64_t j = rmoe_lane() * V; j < H; j += RMOE_WARP * V) {
			float acc[V], v[V];
			rmoe_io<T, V>::ld(dst + t * H + j, acc);
			for (int64_t k = 0; k < K && at[k] >= 0; k++) {
				rmoe_io<T, V>::ld(rows + at[k] * H + j, v);
				const float g = w ? w[order[first + at[k]]] : 1.0f;
				for (int q = 0; q < V; q++)
					acc[q] = rmoe_add_rn(acc[q], w ? rmoe_mul_rn(g, v[q]) : v[q]);
			}
			rmoe_io<T, V>::st(dst + t * H + j, acc);
		}
	}
}

template <typename T>
static int rows_add(cudaStream_t s, int64_t H, int64_t K, int64_t n_pairs, int64_t first, int64_t count,
                    const T *rows, const int32_t *order, const float *w, T *dst, int32_t *index)
{
	if (!index) {
		fprintf(stderr, "relaymoe: CUDA scatter-add: no index scratch\n");
		return RMOE_CUDA_ERUNTIME;
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
		if (rmoe_vec_ok<T>(H, {rows, dst}))
			RMOE_LAUNCH(rows_add_ordered_k, rmoe_cuda_warp_rows(ntok), RMOE_CUDA_THREADS, 0, s,
			            rmoe_width<rmoe_vec<T>::n>(), ntok, H, K, first, rows, order, w, index, dst);
		else
			RMOE_LAUNCH(rows_add_ordered_k, rmoe_cuda_warp_rows(ntok), RMOE_CUDA_THREADS, 0, s, rmoe_width<1>(), ntok,
			            H, K, first, rows, order, w, index, dst);
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

/* Every scatter-add takes the index: the additions are ordered whether or
 * not --deterministic asked for it. */
extern "C" size_t rmoe_cuda_rows_add_scratch(int deterministic, int64_t n_pairs)
{
	(void)deterministic;
	return n_pairs > 0 ? (size_t)n_pairs * sizeof(int32_t) : 0;
}

/* A warp per row: dout = g dy[t], dg[p] = <dy[t], back>. */
template <typename T, int V>
__global__ void unpermute_bwd_k(rmoe_width<V>, int64_t H, int64_t K, int64_t first, int64_t count,
                                const T *__restrict__ dy, const T *__restrict__ back, const int32_t *__restrict__ order,
                                const float *__restrict__ w, T *__restrict__ dout, float *__restrict__ dg)
{
	for (int64_t i = rmoe_warp_id(); i < count; i += rmoe_warps()) {
		const int64_t p = order[first + i];
		const float g = w[p];
		const T *dyt = dy + p / K * H, *bi = back + i * H;
		T *d = dout + i * H;
		float acc = 0.0f;
		for (int64_t j = rmoe_lane() * V; j < H; j += RMOE_WARP * V) {
			float y[V], bv[V];
			rmoe_io<T, V>::ld(dyt + j, y);
			rmoe_io<T, V>::ld(bi + j, bv);
			for (int q = 0; q < V; q++) {
				acc += y[q] * bv[q];
				bv[q] = g * y[q];
			}
			rmoe_io<T, V>::st(d + j, bv);
		}
		acc = rmoe_warp_sum(acc);
		if (rmoe_lane() == 0)
			dg[p] = acc;
	}
}

template <typename T>
static int gather(cudaStream_t s, int64_t H, int64_t K, int64_t first, int64_t count, const T *src,
                  const int32_t *order, const float *w, T *rows)
{
	if (rmoe_vec_ok<T>(H, {src, rows}))
		RMOE_LAUNCH(gather_k, rmoe_cuda_warp_rows(count), RMOE_CUDA_THREADS, 0, s, rmoe_width<rmoe_vec<T>::n>(), H, K,
		            first, count, src, order, w, rows);
	else
		RMOE_LAUNCH(gather_k, rmoe_cuda_warp_rows(count), RMOE_CUDA_THREADS, 0, s, rmoe_width<1>(), H, K, first,
		            count, src, order, w, rows);
	return rmoe_cuda_check("gather");
}

template <typename T>
static int unpermute_bwd(cudaStream_t s, int64_t H, int64_t K, int64_t first, int64_t count, const T *dy,
                         const T *back, const int32_t *order, const float *w, T *dout, float *dg)
{
	if (rmoe_vec_ok<T>(H, {dy, back, dout}))
		RMOE_LAUNCH(unpermute_bwd_k, rmoe_cuda_warp_rows(count), RMOE_CUDA_THREADS, 0, s, rmoe_width<rmoe_vec<T>::n>(),
		            H, K, first, count, dy, back, order, w, dout, dg);
	else
		RMOE_LAUNCH(unpermute_bwd_k, rmoe_cuda_warp_rows(count), RMOE_CUDA_THREADS, 0, s, rmoe_width<1>(), H, K,
		            first, count, dy, back, order, w, dout, dg);
	return rmoe_cuda_check("unpermute-bwd");
}

extern "C" int rmoe_cuda_gather(cudaStream_t s, int bf16, int64_t H, int64_t K, int64_t first, int64_t count,
                                const void *src, const int32_t *order, const float *w, void *rows)
{
	if (count == 0)
		return 0;
	if (bf16)
		return gather(s, H, K, first, count, (const rmoe_bf16_t *)src, order, w, (rmoe_bf16_t *)rows);
	return gather(s, H, K, first, count, (const float *)src, order, w, (float *)rows);
}

/* deterministic: no longer a choice (rmoe_cuda_rows_add_scratch); kept
 * in the signature the codelets call. */
extern "C" int rmoe_cuda_scatter_add(cudaStream_t s, int bf16, int64_t H, int64_t K, int64_t n_pairs, int64_t first,
                                     int64_t count, const void *rows, const int32_t *order, const float *w, void *dst,
                                     int deterministic, struct rmoe_cuda_scratch scratch)
{
	(void)deterministic;
	if (count == 0)
		return 0;
	struct rmoe_arena a = rmoe_arena_of(scratch, s);
	int32_t *index = NULL;
	int rc = rmoe_arena_take(&a, (size_t)n_pairs * sizeof(int32_t), (void **)&index);
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
		return unpermute_bwd(s, H, K, first, count, (const rmoe_bf16_t *)dy, (const rmoe_bf16_t *)back, order, w,
		                     (rmoe_bf16_t *)dout, dg);
	return unpermute_bwd(s, H, K, first, count, (const float *)dy, (const float *)back, order, w, (float *)dout, dg);
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

extern "C" int rmoe_cuda_copy_pad(cudaStream_t s, size_t elsize, int64_t n_src, int64_t n_dst, const void *src,
                                  void *dst)
{
	const int64_t n = n_src < n_dst ? n_src : n_dst;
	int rc = n > 0 ? rmoe_cuda_ok(cudaMemcpyAsync(dst, src, (size_t)n * elsize, cudaMemcpyDeviceToDevice, s),
	                              "memcpy")
	               : 0;
	if (!rc && n_dst > n)
		rc = rmoe_cuda_zero(s, elsize, n_dst - n, (char *)dst + (size_t)n * elsize);
	return rc;
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
