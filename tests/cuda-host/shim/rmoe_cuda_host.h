/* The CUDA execution model on the host, for the cuda-host test: included
 * (-include) before every line of the .cu files of codelets/kernels/,
 * compiled as C++ with the CUDA toolkit's headers for the types. A kernel
 * launch (RMOE_LAUNCH) runs its blocks one after the other on the calling
 * thread, each block's threads as cooperative fibers that switch at
 * __syncthreads and at warp shuffles, so kernels that reduce over a block
 * run as written. Memory is host memory; streams are no-ops (everything is
 * done when a call returns). cuda_host_runtime.cpp implements it, with the
 * runtime and cuBLAS entry points the launchers call. */
#ifndef RMOE_CUDA_HOST_H
#define RMOE_CUDA_HOST_H

/* Defined first, the toolkit's host_defines.h keeps them. */
#define __host__
#define __device__
#define __global__
/* Blocks run one at a time and a block's threads share one OS thread: a
 * static is the block's shared memory. */
#define __shared__ static

#include <stdint.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
#include <functional>

extern "C" {
#endif

/* ---- what a test sets ---------------------------------------------------- */

/* The order in which blocks, and a block's threads, run: seed 0 in order,
 * else a permutation drawn from the seed for every launch (the atomic
 * additions then come in another order). */
void rmoe_cuda_host_schedule(unsigned seed);
/* Injected failures: the n-th launch from now fails (cudaErrorLaunchFailure
 * from cudaGetLastError; the kernel does not run); the n-th GEMM from now
 * returns status; the n-th cudaMallocAsync fails. n = 0 clears. */
void rmoe_cuda_host_fail_launch(int n);
void rmoe_cuda_host_fail_gemm(int n, cublasStatus_t status);
void rmoe_cuda_host_fail_malloc(int n);
/* Counts since the last reset: launches, GEMMs, cudaMallocAsync calls and
 * the bytes they took. */
struct rmoe_cuda_host_counts {
	long launches, gemms, mallocs;
	size_t malloc_bytes;
};
void rmoe_cuda_host_counts(struct rmoe_cuda_host_counts *c);
void rmoe_cuda_host_reset_counts(void);
/* Every GEMM problem (of cublasGemmEx, and of each batched or grouped
 * call) is passed to this hook when set (its arguments, as cuBLAS takes
 * them), e.g. to list the call shapes a launcher makes. */
typedef void (*rmoe_cuda_host_gemm_hook)(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, int lda,
                                         int ldb, int ldc, cudaDataType at, cudaDataType bt, cudaDataType ct,
                                         float beta);
void rmoe_cuda_host_on_gemm(rmoe_cuda_host_gemm_hook hook);
/* Frees what launches kept (the threads' stacks). */
void rmoe_cuda_host_release(void);

/* ---- the execution model ----------------------------------------------------- */

extern uint3 rmoe_host_thread_idx, rmoe_host_block_idx;
extern dim3 rmoe_host_block_dim, rmoe_host_grid_dim;

void rmoe_host_syncthreads(void);
/* A warp shuffle of up to 64 bits: lane l gets v of lane l + arg (down),
 * l ^ arg (xor) or arg (index), its own v where that lane is past the
 * warp's or the block's end. */
enum rmoe_host_shfl_kind { RMOE_HOST_SHFL_DOWN, RMOE_HOST_SHFL_XOR, RMOE_HOST_SHFL_IDX };
uint64_t rmoe_host_shfl(uint64_t v, enum rmoe_host_shfl_kind kind, unsigned arg);

#ifdef __cplusplus
}

#define threadIdx rmoe_host_thread_idx
#define blockIdx rmoe_host_block_idx
#define blockDim rmoe_host_block_dim
#define gridDim rmoe_host_grid_dim

static inline void __syncthreads(void)
{
	rmoe_host_syncthreads();
}

template <typename V> static inline V rmoe_host_shfl_of(V v, enum rmoe_host_shfl_kind kind, unsigned arg)
{
	static_assert(sizeof(V) <= sizeof(uint64_t), "a shuffle moves at most 64 bits");
	uint64_t u = 0;
	memcpy(&u, &v, sizeof(v));
	u = rmoe_host_shfl(u, kind, arg);
	memcpy(&v, &u, sizeof(v));
	return v;
}

template <typename V> static inline V __shfl_down_sync(unsigned mask, V v, unsigned delta, int width = 32)
{
	(void)mask;
	(void)width;
	return rmoe_host_shfl_of(v, RMOE_HOST_SHFL_DOWN, delta);
}

template <typename V> static inline V __shfl_xor_sync(unsigned mask, V v, int lane_mask, int width = 32)
{
	(void)mask;
	(void)width;
	return rmoe_host_shfl_of(v, RMOE_HOST_SHFL_XOR, (unsigned)lane_mask);
}

template <typename V> static inline V __shfl_sync(unsigned mask, V v, int src_lane, int width = 32)
{
	(void)mask;
	(void)width;
	return rmoe_host_shfl_of(v, RMOE_HOST_SHFL_IDX, (unsigned)src_lane % 32);
}

/* Fibers switch only at the calls above: a read-modify-write is atomic. */
static inline float atomicAdd(float *p, float v)
{
	float old = *p;
	*p = old + v;
	return old;
}
static inline int atomicAdd(int *p, int v)
{
	int old = *p;
	*p = old + v;
	return old;
}
static inline __nv_bfloat16 atomicAdd(__nv_bfloat16 *p, __nv_bfloat16 v)
{
	__nv_bfloat16 old = *p;
	*p = __float2bfloat16_rn(__bfloat162float(old) + __bfloat162float(v));
	return old;
}

/* Built with -ffp-contract=off: nothing is fused. */
static inline float __fadd_rn(float a, float b)
{
	return a + b;
}
static inline float __fmul_rn(float a, float b)
{
	return a * b;
}

/* Runs body once per thread of every block of grid (cudaGetLastError then
 * says whether the configuration was refused or a failure injected). */
void rmoe_host_launch(dim3 grid, dim3 block, size_t shmem, cudaStream_t s, std::function<void()> body);

#define RMOE_LAUNCH(kernel, grid, block, shmem, stream, ...) \
	rmoe_host_launch(dim3(grid), dim3(block), (shmem), (stream), [=]() { kernel(__VA_ARGS__); })
#endif /* __cplusplus */

#endif /* RMOE_CUDA_HOST_H */
