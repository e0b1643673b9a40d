/* CUDA kernels of the experts over one partition: one cuBLAS GEMM per
 * expert and matrix on the rows grouped by expert (fp32 accumulation
 * whatever the storage type), elementwise kernels over all the partition's
 * rows at once, in the phases of the CPU kernels (rmoe_kernels.h). */
#include "cuda_common.cuh"

/* act = silu(gate) * up over n elements. */
template <typename T> __global__ void swiglu_k(int64_t n, const T *gate, const T *up, T *act)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		rmoe_st(act, i, rmoe_swiglu(rmoe_ld(gate, i), rmoe_ld(up, i)));
}

/* SwiGLU backward in place: gate and up pre-activations become their
 * gradients, from dact. */
template <typename T> __global__ void swiglu_bwd_k(int64_t n, T *gate, T *up, const T *dact)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		float dg, du;
		rmoe_swiglu_bwd(rmoe_ld(gate, i), rmoe_ld(up, i), rmoe_ld(dact, i), &dg, &du);
		rmoe_st(gate, i, dg);
		rmoe_st(up, i, du);
	}
}

/* Per row of the slice (a block each): dg[p] = <u, act>, then act and u
 * scaled by the pair's routing weight g (§3.3: the weight applied in the
 * kernel, not to a copy of the rows). */
template <typename T>
__global__ void pair_weight_k(int64_t m, int64_t F, int64_t first, const int32_t *order, const float *topk_w,
                              T *act, T *u, float *dg)
{
	for (int64_t i = blockIdx.x; i < m; i += gridDim.x) {
		const int64_t p = order[first + i];
		const float g = topk_w[p];
		T *a = act + i * F, *ui = u + i * F;
		float acc = 0.0f;
		for (int64_t j = threadIdx.x; j < F; j += blockDim.x)
			acc += rmoe_ld(ui, j) * rmoe_ld(a, j);
		acc = rmoe_block_sum(acc);
		if (threadIdx.x == 0)
			dg[p] = acc;
		for (int64_t j = threadIdx.x; j < F; j += blockDim.x) {
			rmoe_st(a, j, g * rmoe_ld(a, j));
			rmoe_st(ui, j, g * rmoe_ld(ui, j));
		}
	}
}

/* Offsets of one expert's matrices in a partition's weights. */
struct expert_w {
	int64_t gate, up, down;
};
static inline struct expert_w offsets(int64_t ne, int64_t H, int64_t F, int64_t e)
{
	return (struct expert_w){rmoe_w_gate_offset(ne, H, F, e), rmoe_w_up_offset(ne, H, F, e),
	                         rmoe_w_down_offset(ne, H, F, e)};
}

template <typename T>
static int expert_ffn(cudaStream_t s, cublasHandle_t b, int64_t H, int64_t F, int64_t ne, const int64_t *rpe,
                      int64_t m, const T *x, const T *w, T *work, T *out)
{
	const cudaDataType_t ty = rmoe_cuda_type<T>::id;
	T *gate = work, *up = work + m * F, *act = work + 2 * m * F;
	int rc = 0;
	for (int64_t e = 0, o = 0; e < ne && !rc; o += rpe[e], e++) {
		const struct expert_w ow = offsets(ne, H, F, e);
		rc = rmoe_gemm_rm(b, 0, 0, rpe[e], F, H, 1.0f, x + o * H, ty, H, w + ow.gate, ty, F, 0.0f, gate + o * F, ty, F);
		if (!rc)
			rc = rmoe_gemm_rm(b, 0, 0, rpe[e], F, H, 1.0f, x + o * H, ty, H, w + ow.up, ty, F, 0.0f, up + o * F, ty, F);
	}
	if (!rc && m > 0) {
		RMOE_LAUNCH(swiglu_k, rmoe_cuda_blocks(m * F), RMOE_CUDA_THREADS, 0, s, m * F, gate, up, act);
		rc = rmoe_cuda_check("swiglu");
	}
	for (int64_t e = 0, o = 0; out && e < ne && !rc; o += rpe[e], e++)
		rc = rmoe_gemm_rm(b, 0, 0, rpe[e], H, F, 1.0f, act + o * F, ty, F, w + offsets(ne, H, F, e).down, ty, H, 0.0f,
		                  out + o * H, ty, H);
	return rc;
}

/* The tail shared by both backward modes, per expert: dw_gate, dw_up =
 * x^T dpre, then the rows' dx = dpre_gate w_gate^T + dpre_up w_up^T (the
 * weight-gradient GEMMs are enqueued first: dx may overwrite x). An expert
 * without rows gets a zero gradient unless the task accumulates. */
template <typename T>
static int bwd_tail(cudaStream_t s, cublasHandle_t b, int64_t H, int64_t F, int64_t ne, const int64_t *rpe,
                    int64_t m, const T *x, const T *w, T *work, T *dx, T *dw, float beta)
{
	const cudaDataType_t ty = rmoe_cuda_type<T>::id;
	T *dgate = work, *dup = work + m * F;
	int rc = 0;
	for (int64_t e = 0, o = 0; e < ne && !rc; o += rpe[e], e++) {
		const struct expert_w ow = offsets(ne, H, F, e);
		const int64_t r = rpe[e];
		if (r == 0) {
			if (beta == 0.0f)
				for (int k = 0; k < 3 && !rc; k++)
					rc = rmoe_cuda_ok(cudaMemsetAsync(dw + (k == 0 ? ow.gate : k == 1 ? ow.up : ow.down), 0,
					                                  (size_t)(H * F) * sizeof(T), s),
					                  "memset");
			continue;
		}
		rc = rmoe_gemm_rm(b, 1, 0, H, F, r, 1.0f, x + o * H, ty, H, dgate + o * F, ty, F, beta, dw + ow.gate, ty, F);
		if (!rc)
			rc = rmoe_gemm_rm(b, 1, 0, H, F, r, 1.0f, x + o * H, ty, H, dup + o * F, ty, F, beta, dw + ow.up, ty, F);
		if (!rc)
			rc = rmoe_gemm_rm(b, 0, 1, r, H, F, 1.0f, dgate + o * F, ty, F, w + ow.gate, ty, F, 0.0f, dx + o * H, ty, H);
		if (!rc)
			rc = rmoe_gemm_rm(b, 0, 1, r, H, F, 1.0f, dup + o * F, ty, F, w + ow.up, ty, F, 1.0f, dx + o * H, ty, H);
	}
	return rc;
}

template <typename T>
static int expert_bwd_pairs(cudaStream_t s, cublasHandle_t b, int64_t H, int64_t F, int64_t ne, const int64_t *rpe,
                            int64_t m, int64_t n_pairs, int64_t first, int64_t K, int accumulate, T *x, const T *dy,
                            const T *w, const int32_t *order, const float *topk_w, T *work, T *dx, float *dg, T *dw,
                            int32_t *index)
{
	const cudaDataType_t ty = rmoe_cuda_type<T>::id;
	const float beta = accumulate ? 1.0f : 0.0f;
	T *gate = work, *up = work + m * F, *act = work + 2 * m * F, *u = work + 3 * m * F;
	int rc = 0;
	/* u = dy w_down^T: dL/dg of a pair is <u, act>. */
	for (int64_t e = 0, o = 0; e < ne && !rc; o += rpe[e], e++)
		rc = rmoe_gemm_rm(b, 0, 1, rpe[e], F, H, 1.0f, dy + o * H, ty, H, w + offsets(ne, H, F, e).down, ty, H, 0.0f,
		                  u + o * F, ty, F);
	if (!rc && m > 0) {
		RMOE_LAUNCH(pair_weight_k, rmoe_cuda_rows(m), RMOE_CUDA_THREADS, 0, s, m, F, first, order, topk_w, act, u, dg);
		rc = rmoe_cuda_check("pair weights");
	}
	/* dw_down = (g act)^T dy; then u holds dact = g u. */
	for (int64_t e = 0, o = 0; e < ne && !rc; o += rpe[e], e++)
		if (rpe[e])
			rc = rmoe_gemm_rm(b, 1, 0, F, H, rpe[e], 1.0f, act + o * F, ty, F, dy + o * H, ty, H, beta,
			                  dw + offsets(ne, H, F, e).down, ty, H);
	if (!rc && m > 0) {
		RMOE_LAUNCH(swiglu_bwd_k, rmoe_cuda_blocks(m * F), RMOE_CUDA_THREADS, 0, s, m * F, gate, up, u);
		rc = rmoe_cuda_check("swiglu backward");
	}
	/* The rows' dx over the consumed x rows, then added at their tokens
	 * (without dx, the lean all-to-all's, they stay in x) as the
	 * scatter-add adds. */
	if (!rc)
		rc = bwd_tail(s, b, H, F, ne, rpe, m, x, w, work, x, dw, beta);
	if (!rc && m > 0 && dx)
		rc = rmoe_cuda_rows_add(s, rmoe_cuda_type<T>::id == CUDA_R_16BF, H, K, n_pairs, first, m, x, order, NULL, dx,
		                        index);
	return rc;
}

template <typename T>
static int expert_bwd_preweighted(cudaStream_t s, cublasHandle_t b, int64_t H, int64_t F, int64_t ne,
                                  const int64_t *rpe, int64_t m, int accumulate, const T *x, const T *dout,
                                  const T *w, T *work, T *dx, T *dw)
{
	const cudaDataType_t ty = rmoe_cuda_type<T>::id;
	const float beta = accumulate ? 1.0f : 0.0f;
	T *gate = work, *up = work + m * F, *act = work + 2 * m * F;
	int rc = 0;
	/* dw_down = act^T dout reads act before dact = dout w_down^T replaces it. */
	for (int64_t e = 0, o = 0; e < ne && !rc; o += rpe[e], e++) {
		if (!rpe[e])
			continue;
		const int64_t down = offsets(ne, H, F, e).down;
		rc = rmoe_gemm_rm(b, 1, 0, F, H, rpe[e], 1.0f, act + o * F, ty, F, dout + o * H, ty, H, beta, dw + down, ty, H);
		if (!rc)
			rc = rmoe_gemm_rm(b, 0, 1, rpe[e], F, H, 1.0f, dout + o * H, ty, H, w + down, ty, H, 0.0f, act + o * F, ty, F);
	}
	if (!rc && m > 0) {
		RMOE_LAUNCH(swiglu_bwd_k, rmoe_cuda_blocks(m * F), RMOE_CUDA_THREADS, 0, s, m * F, gate, up, act);
		rc = rmoe_cuda_check("swiglu backward");
	}
	if (!rc)
		rc = bwd_tail(s, b, H, F, ne, rpe, m, x, w, work, dx, dw, beta);
	return rc;
}

extern "C" int rmoe_cuda_expert_ffn(cudaStream_t s, cublasHandle_t b, int bf16, int64_t H, int64_t F, int64_t ne,
                                    const int64_t *rpe, int64_t m, const void *x, const void *w, void *work,
                                    void *out)
{
	if (bf16)
		return expert_ffn(s, b, H, F, ne, rpe, m, (const rmoe_bf16_t *)x, (const rmoe_bf16_t *)w,
		                  (rmoe_bf16_t *)work, (rmoe_bf16_t *)out);
	return expert_ffn(s, b, H, F, ne, rpe, m, (const float *)x, (const float *)w, (float *)work, (float *)out);
}

extern "C" int rmoe_cuda_expert_bwd_pairs(cudaStream_t s, cublasHandle_t b, int bf16, int64_t H, int64_t F,
                                          int64_t ne, const int64_t *rpe, int64_t m, int64_t n_pairs, int64_t first,
                                          int64_t K, int accumulate, void *x, const void *dy, const void *w,
                                          const int32_t *order, const float *topk_w, void *work, void *dx,
                                          float *dg, void *dw, int deterministic, struct rmoe_cuda_scratch scratch)
{
	struct rmoe_arena a = rmoe_arena_of(scratch, s);
	int32_t *index = NULL;
	int rc = deterministic && dx && m > 0 ? rmoe_arena_take(&a, (size_t)n_pairs * sizeof(int32_t), (void **)&index)
	                                      : 0;
	if (!rc && bf16)
		rc = expert_bwd_pairs(s, b, H, F, ne, rpe, m, n_pairs, first, K, accumulate, (rmoe_bf16_t *)x,
		                      (const rmoe_bf16_t *)dy, (const rmoe_bf16_t *)w, order, topk_w, (rmoe_bf16_t *)work,
		                      (rmoe_bf16_t *)dx, dg, (rmoe_bf16_t *)dw, index);
	else if (!rc)
		rc = expert_bwd_pairs(s, b, H, F, ne, rpe, m, n_pairs, first, K, accumulate, (float *)x, (const float *)dy,
		                      (const float *)w, order, topk_w, (float *)work, (float *)dx, dg, (float *)dw, index);
	const int released = rmoe_arena_release(&a);
	return rc ? rc : released;
}

extern "C" int rmoe_cuda_expert_bwd_preweighted(cudaStream_t s, cublasHandle_t b, int bf16, int64_t H, int64_t F,
                                                int64_t ne, const int64_t *rpe, int64_t m, int accumulate,
                                                const void *x, const void *dout, const void *w, void *work,
                                                void *dx, void *dw)
{
	if (bf16)
		return expert_bwd_preweighted(s, b, H, F, ne, rpe, m, accumulate, (const rmoe_bf16_t *)x,
		                              (const rmoe_bf16_t *)dout, (const rmoe_bf16_t *)w, (rmoe_bf16_t *)work,
		                              (rmoe_bf16_t *)dx, (rmoe_bf16_t *)dw);
	return expert_bwd_preweighted(s, b, H, F, ne, rpe, m, accumulate, (const float *)x, (const float *)dout,
	                              (const float *)w, (float *)work, (float *)dx, (float *)dw);
}
