/* What the CUDA kernels share: element loads and stores in fp32 whatever
 * the storage type, launch shapes, error reporting, row-major GEMMs through
 * cuBLAS, and stream-ordered scratch. */
#ifndef RMOE_CUDA_COMMON_CUH
#define RMOE_CUDA_COMMON_CUH

#include <stdint.h>
#include <stdio.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "rmoe_kernel_math.h"
#include "rmoe_kernels_cuda.h"

typedef __nv_bfloat16 rmoe_bf16_t;

/* Every element is computed in fp32. */
static __device__ __forceinline__ float rmoe_ld(const float *p, int64_t i)
{
	return p[i];
}
static __device__ __forceinline__ float rmoe_ld(const rmoe_bf16_t *p, int64_t i)
{
	return __bfloat162float(p[i]);
}
static __device__ __forceinline__ void rmoe_st(float *p, int64_t i, float v)
{
	p[i] = v;
}
static __device__ __forceinline__ void rmoe_st(rmoe_bf16_t *p, int64_t i, float v)
{
	p[i] = __float2bfloat16_rn(v);
}
static __device__ __forceinline__ void rmoe_add(float *p, int64_t i, float v)
{
	atomicAdd(p + i, v);
}
static __device__ __forceinline__ void rmoe_add(rmoe_bf16_t *p, int64_t i, float v)
{
	atomicAdd(p + i, __float2bfloat16_rn(v));
}

/* The sum of v over the block, returned to every thread; blockDim.x a
 * multiple of 32, at most 1024. */
static __device__ float rmoe_block_sum(float v)
{
	__shared__ float part[32];
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_down_sync(0xffffffffu, v, o);
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	if (lane == 0)
		part[warp] = v;
	__syncthreads();
	v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
	if (warp == 0)
		for (int o = 16; o > 0; o >>= 1)
			v += __shfl_down_sync(0xffffffffu, v, o);
	__syncthreads();
	if (threadIdx.x == 0)
		part[0] = v;
	__syncthreads();
	v = part[0];
	__syncthreads();
	return v;
}

template <typename T> struct rmoe_cuda_type;
template <> struct rmoe_cuda_type<float> {
	static constexpr cudaDataType_t id = CUDA_R_32F;
};
template <> struct rmoe_cuda_type<rmoe_bf16_t> {
	static constexpr cudaDataType_t id = CUDA_R_16BF;
};

/* Grid-stride launches: blocks of 256 threads, at most this many blocks. */
#define RMOE_CUDA_THREADS 256
static inline unsigned rmoe_cuda_blocks(int64_t n)
{
	int64_t b = (n + RMOE_CUDA_THREADS - 1) / RMOE_CUDA_THREADS;
	return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}
static inline unsigned rmoe_cuda_rows(int64_t rows)
{
	return (unsigned)(rows < 1 ? 1 : rows > 65535 ? 65535 : rows);
}

/* The error, if any, of what was just enqueued. */
static inline int rmoe_cuda_check(const char *what)
{
	cudaError_t e = cudaGetLastError();
	if (e == cudaSuccess)
		return 0;
	fprintf(stderr, "relaymoe: CUDA %s: %s\n", what, cudaGetErrorString(e));
	return -1;
}

static inline int rmoe_cuda_ok(cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 0;
	fprintf(stderr, "relaymoe: CUDA %s: %s\n", what, cudaGetErrorString(e));
	return -1;
}

static inline int rmoe_cublas_ok(cublasStatus_t st, const char *what)
{
	if (st == CUBLAS_STATUS_SUCCESS)
		return 0;
	fprintf(stderr, "relaymoe: cuBLAS %s: %s\n", what, cublasGetStatusString(st));
	return -1;
}

/* Row-major C[m, n] = alpha op(A) op(B) + beta C, op(A) [m, k], op(B) [k, n],
 * lda, ldb, ldc the row strides as stored; cuBLAS is column-major, so it
 * computes C^T = op(B)^T op(A)^T. fp32 accumulation whatever the types. */
static inline int rmoe_gemm_rm(cublasHandle_t b, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                               const void *A, cudaDataType_t at, int64_t lda, const void *B, cudaDataType_t bt,
                               int64_t ldb, float beta, void *C, cudaDataType_t ct, int64_t ldc)
{
	if (m == 0 || n == 0)
		return 0;
	return rmoe_cublas_ok(cublasGemmEx(b, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n,
	                                   (int)m, (int)k, &alpha, B, bt, (int)ldb, A, at, (int)lda, &beta, C, ct,
	                                   (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
	                      "cublasGemmEx");
}

/* Scratch in the stream's order: freed when the work enqueued before its
 * release is done. */
static inline int rmoe_cuda_scratch(void **p, size_t bytes, cudaStream_t s)
{
	return rmoe_cuda_ok(cudaMallocAsync(p, bytes > 0 ? bytes : 1, s), "cudaMallocAsync");
}
static inline void rmoe_cuda_release(void *p, cudaStream_t s)
{
	if (p)
		cudaFreeAsync(p, s);
}

#endif /* RMOE_CUDA_COMMON_CUH */
