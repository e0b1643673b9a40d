/* The CUDA twins of the kernels of rmoe_kernels.h: the same operations on
 * device pointers, enqueued on the stream they are given (a StarPU worker's)
 * with cuBLAS on the handle given (set to that stream); nothing waits on the
 * host. No StarPU here either.
 *
 * Element types: activations and weights are float32 (bf16 = 0) or bf16
 * (bf16 = 1), every GEMM with fp32 accumulation (compute
 * CUBLAS_COMPUTE_32F) and every elementwise kernel in fp32; the routing
 * (probs, topk_w, dg) and the router's weights are float32, indices int32
 * (with bf16 activations the router's GEMMs run on tensor cores over an
 * exact three-way bf16 split of its fp32 operands: cuda_rows.cu).
 * rows_per_expert and counts are host arrays (they shape the launches).
 *
 * The expert launchers make one cuBLAS call per matrix for all the
 * partition's experts: RMOE_CUDA_GEMM=grouped (the default,
 * cublasGemmGroupedBatchedEx), strided (cublasGemmStridedBatchedEx over
 * rows padded per expert) or loop (a cublasGemmEx per expert), as
 * rmoe_cuda_gemm_select last chose (cuda_gemm.cuh).
 *
 * Each returns 0, or after printing the error of the launch or call that
 * failed, one of the codes below: what the task that called it reports. */
#ifndef RMOE_KERNELS_CUDA_H
#define RMOE_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

enum rmoe_cuda_status {
	RMOE_CUDA_ELAUNCH = -1,  /* a kernel launch (cudaGetLastError after it) */
	RMOE_CUDA_ERUNTIME = -2, /* a CUDA runtime call: scratch, memset, copy */
	RMOE_CUDA_ECUBLAS = -3,  /* a cuBLAS call's status */
};

/* The expert launchers' GEMM way by its name, "grouped", "strided" or
 * "loop" (NULL or "": the default, grouped where cuBLAS has it, else
 * strided): 0, or -1 for a name it does not know, the default then
 * chosen. rmoe_cuda_gemm_way: the way chosen (enum rmoe_gemm_way,
 * cuda_gemm.cuh); rmoe_cuda_gemm_name its name. */
int rmoe_cuda_gemm_select(const char *name);
int rmoe_cuda_gemm_way(void);
const char *rmoe_cuda_gemm_name(void);

/* What a launcher's non-zero return says, for the task's status. */
static inline const char *rmoe_cuda_status_what(int rc)
{
	return rc == RMOE_CUDA_ELAUNCH    ? "a CUDA kernel launch failed"
	       : rc == RMOE_CUDA_ERUNTIME ? "a CUDA runtime call failed"
	       : rc == RMOE_CUDA_ECUBLAS  ? "a cuBLAS call failed"
	                                  : "a CUDA launcher failed";
}

/* Device scratch given to a launcher: the task's STARPU_SCRATCH buffer,
 * bytes at p, sized by the rmoe_cuda_*_scratch function of the launcher
 * (host code, no CUDA call). With p NULL, or too small, the launcher
 * allocates what it lacks in the stream's order (cudaMallocAsync), which
 * StarPU's memory accounting does not see. */
struct rmoe_cuda_scratch {
	void *p;
	size_t bytes;
};

size_t rmoe_cuda_router_fwd_scratch(int bf16, int64_t tokens, int64_t hidden, int64_t experts);
size_t rmoe_cuda_router_bwd_scratch(int bf16, int64_t tokens, int64_t hidden, int64_t experts);
size_t rmoe_cuda_dispatch_map_scratch(int64_t pairs, int64_t experts);
/* The index of the ordered additions of rmoe_cuda_scatter_add (n_pairs
 * int32, deterministic or not: no launcher adds rows with atomics). */
size_t rmoe_cuda_rows_add_scratch(int deterministic, int64_t n_pairs);
/* The grouped GEMMs' pointer arrays of rmoe_cuda_expert_ffn over
 * n_experts (it takes no scratch argument: it allocates them in the
 * stream's order), and the whole scratch of rmoe_cuda_expert_bwd_pairs
 * with dx: the index of its dx additions, then those arrays. */
size_t rmoe_cuda_expert_ffn_scratch(int64_t n_experts);
size_t rmoe_cuda_expert_bwd_scratch(int deterministic, int64_t n_pairs, int64_t n_experts);

int rmoe_cuda_router_fwd(cudaStream_t s, cublasHandle_t b, int bf16, int64_t tokens, int64_t hidden,
                         int64_t experts, int64_t topk, int norm_topk, const void *x, const float *w_router,
                         float *probs, int32_t *topk_idx, float *topk_w, struct rmoe_cuda_scratch scratch);
int rmoe_cuda_router_bwd(cudaStream_t s, cublasHandle_t b, int bf16, int64_t tokens, int64_t hidden,
                         int64_t experts, int64_t topk, int norm_topk, const void *x, const float *w_router,
                         const float *probs, const int32_t *topk_idx, const float *topk_w, const float *dg,
                         const float *dprobs, void *dx, float *dw_router, struct rmoe_cuda_scratch scratch);
int rmoe_cuda_dispatch_map(cudaStream_t s, int64_t pairs, int64_t experts, const int32_t *topk_idx,
                           int32_t *pair_order, int32_t *counts, struct rmoe_cuda_scratch scratch);

int rmoe_cuda_gather(cudaStream_t s, int bf16, int64_t hidden, int64_t topk, int64_t first, int64_t count,
                     const void *src, const int32_t *pair_order, const float *topk_w, void *rows);
/* dst [n_pairs / topk * hidden]. Without atomics whatever deterministic
 * says: the additions in the CPU kernel's order, bit-identical run after
 * run (scratch of rmoe_cuda_rows_add_scratch). */
int rmoe_cuda_scatter_add(cudaStream_t s, int bf16, int64_t hidden, int64_t topk, int64_t n_pairs, int64_t first,
                          int64_t count, const void *rows, const int32_t *pair_order, const float *topk_w, void *dst,
                          int deterministic, struct rmoe_cuda_scratch scratch);
int rmoe_cuda_unpermute_bwd(cudaStream_t s, int bf16, int64_t hidden, int64_t topk, int64_t first, int64_t count,
                            const void *dy, const void *back, const int32_t *pair_order, const float *topk_w,
                            void *dout, float *dg);

int rmoe_cuda_expert_ffn(cudaStream_t s, cublasHandle_t b, int bf16, int64_t hidden, int64_t ffn,
                         int64_t n_experts, const int64_t *rows_per_expert, int64_t m, const void *x,
                         const void *w, void *work, void *out);
/* n_pairs: pair_order's length (dx [n_pairs / topk * hidden]); the rows'
 * dx added into dx as rmoe_cuda_scatter_add adds (scratch: its index, then
 * the GEMMs' pointer arrays, rmoe_cuda_expert_bwd_scratch; what does not
 * fit is allocated in the stream's order). */
int rmoe_cuda_expert_bwd_pairs(cudaStream_t s, cublasHandle_t b, int bf16, int64_t hidden, int64_t ffn,
                               int64_t n_experts, const int64_t *rows_per_expert, int64_t m, int64_t n_pairs,
                               int64_t first, int64_t topk, int accumulate, void *x, const void *dy, const void *w,
                               const int32_t *pair_order, const float *topk_w, void *work, void *dx, float *dg,
                               void *dweights, int deterministic, struct rmoe_cuda_scratch scratch);
int rmoe_cuda_expert_bwd_preweighted(cudaStream_t s, cublasHandle_t b, int bf16, int64_t hidden, int64_t ffn,
                                     int64_t n_experts, const int64_t *rows_per_expert, int64_t m,
                                     int accumulate, const void *x, const void *dout, const void *w, void *work,
                                     void *dx, void *dweights);

/* The shared expert's gate (rmoe_kernel_shared_gate_*): x, s, dy, dx in
 * the element type, w and dw float32; the backward's dz in scratch of
 * rmoe_cuda_shared_gate_bwd_scratch bytes. */
size_t rmoe_cuda_shared_gate_bwd_scratch(int64_t tokens);
int rmoe_cuda_shared_gate_fwd(cudaStream_t s, int bf16, int64_t tokens, int64_t hidden, const void *x,
                              const float *w, void *sh);
int rmoe_cuda_shared_gate_bwd(cudaStream_t s, int bf16, int64_t tokens, int64_t hidden, const void *x,
                              const float *w, const void *dy, void *sh, void *dx, float *dw,
                              struct rmoe_cuda_scratch scratch);

int rmoe_cuda_accumulate(cudaStream_t s, int bf16, int64_t n, const void *src, void *dst);
int rmoe_cuda_zero(cudaStream_t s, size_t elsize, int64_t n, void *dst);
int rmoe_cuda_copy_pad(cudaStream_t s, size_t elsize, int64_t n_src, int64_t n_dst, const void *src, void *dst);
int rmoe_cuda_sort_chunks(cudaStream_t s, size_t elsize, int64_t hidden, int64_t n_peers, int64_t n_experts,
                          const int64_t *counts, int sort, void *const *peer, void *sorted);

#ifdef __cplusplus
}
#endif

#endif /* RMOE_KERNELS_CUDA_H */
