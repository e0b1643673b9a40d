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

/* Every kernel launch. A host build of these files (tests/cuda-host/)
 * defines its own, which runs the blocks on the CPU. */
#ifndef RMOE_LAUNCH
#define RMOE_LAUNCH(kernel, grid, block, shmem, stream, ...) \
	kernel<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__)
#endif

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

/* a + b and a * b rounded as written, never fused into one FMA: the
 * deterministic additions then round as the CPU kernels' do. */
static __device__ __forceinline__ float rmoe_add_rn(float a, float b)
{
	return __fadd_rn(a, b);
}
static __device__ __forceinline__ float rmoe_mul_rn(float a, float b)
{
	return __fmul_rn(a, b);
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

/* The error, if any, of the launch just enqueued: 0 or RMOE_CUDA_ELAUNCH. */
static inline int rmoe_cuda_check(const char *what)
{
	cudaError_t e = cudaGetLastError();
	if (e == cudaSuccess)
		return 0;
	fprintf(stderr, "relaymoe: CUDA %s: %s\n", what, cudaGetErrorString(e));
	return RMOE_CUDA_ELAUNCH;
}

/* A CUDA runtime call's: 0 or RMOE_CUDA_ERUNTIME. */
static inline int rmoe_cuda_ok(cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 0;
	fprintf(stderr, "relaymoe: CUDA %s: %s\n", what, cudaGetErrorString(e));
	return RMOE_CUDA_ERUNTIME;
}

/* A cuBLAS call's: 0 or RMOE_CUDA_ECUBLAS. */
static inline int rmoe_cublas_ok(cublasStatus_t st, const char *what)
{
	if (st == CUBLAS_STATUS_SUCCESS)
		return 0;
	fprintf(stderr, "relaymoe: cuBLAS %s: %s\n", what, cublasGetStatusString(st));
	return RMOE_CUDA_ECUBLAS;
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

/* Device scratch of a launcher: carved from the task's STARPU_SCRATCH
 * buffer (struct rmoe_cuda_scratch), each piece at an offset aligned as
 * cudaMalloc aligns; what does not fit is allocated in the stream's order
 * (cudaMallocAsync, not seen by StarPU) and freed, in that order, by
 * rmoe_arena_release. The rmoe_cuda_*_scratch sizes add up the same
 * pieces (rmoe_arena_size each, the last one as asked). */
#define RMOE_ARENA_ALIGN 256
#define RMOE_ARENA_OWN 4
struct rmoe_arena {
	char *at;
	size_t left;
	cudaStream_t s;
	void *own[RMOE_ARENA_OWN];
	int nown;
};

static inline size_t rmoe_arena_size(size_t bytes)
{
	return (bytes + RMOE_ARENA_ALIGN - 1) / RMOE_ARENA_ALIGN * RMOE_ARENA_ALIGN;
}

static inline struct rmoe_arena rmoe_arena_of(struct rmoe_cuda_scratch sc, cudaStream_t s)
{
	struct rmoe_arena a = {(char *)sc.p, sc.p ? sc.bytes : 0, s, {NULL}, 0};
	return a;
}

static inline int rmoe_arena_take(struct rmoe_arena *a, size_t bytes, void **p)
{
	const size_t need = bytes > 0 ? bytes : 1, padded = rmoe_arena_size(need);
	*p = NULL;
	if (need <= a->left) {
		*p = a->at;
		const size_t used = padded < a->left ? padded : a->left;
		a->at += used;
		a->left -= used;
		return 0;
	}
	if (a->nown == RMOE_ARENA_OWN) {
		fprintf(stderr, "relaymoe: CUDA scratch: more than %d pieces beyond the task's scratch\n", RMOE_ARENA_OWN);
		return RMOE_CUDA_ERUNTIME;
	}
	int rc = rmoe_cuda_ok(cudaMallocAsync(p, need, a->s), "cudaMallocAsync");
	if (!rc)
		a->own[a->nown++] = *p;
	return rc;
}

/* 0, or the error of a release. */
static inline int rmoe_arena_release(struct rmoe_arena *a)
{
	int rc = 0;
	for (int i = 0; i < a->nown; i++) {
		int r = rmoe_cuda_ok(cudaFreeAsync(a->own[i], a->s), "cudaFreeAsync");
		rc = rc ? rc : r;
	}
	a->nown = 0;
	return rc;
}

/* dst[pair's token] += (topk_w[pair] *) rows[i] over the slice [first,
 * first + count) of pair_order, n_pairs pairs of K per token: with index
 * NULL by atomic additions, whose order (and the sum's last bits) may
 * differ from run to run; else in slice order per token, fp32 sums rounded
 * as the CPU kernel's (rmoe_kernel_scatter_add, expert.c's saxpy of the
 * rows' dx), without atomics: index is device scratch of n_pairs int32
 * (rmoe_cuda_rows_add_scratch). cuda_rows.cu. */
int rmoe_cuda_rows_add(cudaStream_t s, int bf16, int64_t H, int64_t K, int64_t n_pairs, int64_t first,
                       int64_t count, const void *rows, const int32_t *order, const float *w, void *dst,
                       int32_t *index);

#endif /* RMOE_CUDA_COMMON_CUH */
