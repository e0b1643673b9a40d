/* What the CUDA kernels share: element loads and stores in fp32 whatever
 * the storage type, launch shapes, error reporting, row-major GEMMs through
 * cuBLAS, and stream-ordered scratch. */
#ifndef RMOE_CUDA_COMMON_CUH
#define RMOE_CUDA_COMMON_CUH

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <initializer_list>

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

/* ---- 16-byte accesses ------------------------------------------------------------- */

/* The row kernels are bound by memory bandwidth: a thread moves 16 bytes
 * per access (4 fp32 or 8 bf16) where the row length and the buffers'
 * alignment allow it, else one element (rmoe_width<1>). The width is a
 * template argument deduced from a tag, so that RMOE_LAUNCH's argument
 * list holds no comma of a template-id. */
template <int V> struct rmoe_width {
};
template <typename T> struct rmoe_vec {
	static constexpr int n = 16 / (int)sizeof(T);
};

static __host__ __device__ __forceinline__ float rmoe_f32_of_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

static __host__ __device__ __forceinline__ uint32_t rmoe_bf16_bits(float v)
{
	return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

/* V elements at p as fp32 (ld) and back (st), rounded as rmoe_st rounds;
 * cp copies them unchanged. p is 16-byte aligned when V > 1. */
template <typename T, int V> struct rmoe_io;
template <typename T> struct rmoe_io<T, 1> {
	static __device__ __forceinline__ void ld(const T *p, float *v)
	{
		v[0] = rmoe_ld(p, 0);
	}
	static __device__ __forceinline__ void st(T *p, const float *v)
	{
		rmoe_st(p, 0, v[0]);
	}
	static __device__ __forceinline__ void cp(T *d, const T *s)
	{
		d[0] = s[0];
	}
};
template <> struct rmoe_io<float, 4> {
	static __device__ __forceinline__ void ld(const float *p, float *v)
	{
		const float4 q = *(const float4 *)p;
		v[0] = q.x;
		v[1] = q.y;
		v[2] = q.z;
		v[3] = q.w;
	}
	static __device__ __forceinline__ void st(float *p, const float *v)
	{
		*(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
	}
	static __device__ __forceinline__ void cp(float *d, const float *s)
	{
		*(float4 *)d = *(const float4 *)s;
	}
};
/* A uint4 holds 8 bf16, element 2i in the low half of word i. */
template <> struct rmoe_io<rmoe_bf16_t, 8> {
	static __device__ __forceinline__ void ld(const rmoe_bf16_t *p, float *v)
	{
		const uint4 q = *(const uint4 *)p;
		const uint32_t w[4] = {q.x, q.y, q.z, q.w};
		for (int i = 0; i < 4; i++) {
			v[2 * i] = rmoe_f32_of_bits(w[i] << 16);
			v[2 * i + 1] = rmoe_f32_of_bits(w[i] & 0xffff0000u);
		}
	}
	static __device__ __forceinline__ void st(rmoe_bf16_t *p, const float *v)
	{
		uint32_t w[4];
		for (int i = 0; i < 4; i++)
			w[i] = rmoe_bf16_bits(v[2 * i]) | rmoe_bf16_bits(v[2 * i + 1]) << 16;
		*(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
	}
	static __device__ __forceinline__ void cp(rmoe_bf16_t *d, const rmoe_bf16_t *s)
	{
		*(uint4 *)d = *(const uint4 *)s;
	}
};

/* Whether rows of cols elements of T at each of the pointers given (NULL
 * ones ignored) can be accessed 16 bytes at a time: every row then starts
 * 16-byte aligned. */
template <typename T> static inline bool rmoe_vec_ok(int64_t cols, std::initializer_list<const void *> ptrs)
{
	if (cols % rmoe_vec<T>::n != 0)
		return false;
	for (const void *p : ptrs)
		if ((uintptr_t)p % 16 != 0)
			return false;
	return true;
}

/* ---- warps ---------------------------------------------------------------------------- */

/* Row kernels run a warp per row (or token), RMOE_CUDA_THREADS / 32 rows
 * per block: a row of H = 2048 bf16 is 8 accesses of 16 bytes per lane. */
#define RMOE_WARP 32
static __device__ __forceinline__ int64_t rmoe_warp_id(void)
{
	return (int64_t)blockIdx.x * (blockDim.x / RMOE_WARP) + threadIdx.x / RMOE_WARP;
}
static __device__ __forceinline__ int64_t rmoe_warps(void)
{
	return (int64_t)gridDim.x * (blockDim.x / RMOE_WARP);
}
static __device__ __forceinline__ int rmoe_lane(void)
{
	return (int)(threadIdx.x % RMOE_WARP);
}

/* Butterfly reductions: every lane gets the result. */
template <typename V> static __device__ __forceinline__ V rmoe_warp_sum(V v)
{
	for (int o = RMOE_WARP / 2; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}
template <typename V> static __device__ __forceinline__ V rmoe_warp_max(V v)
{
	for (int o = RMOE_WARP / 2; o > 0; o >>= 1) {
		const V w = __shfl_xor_sync(0xffffffffu, v, o);
		v = w > v ? w : v;
	}
	return v;
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
/* Blocks of RMOE_CUDA_THREADS for a warp per row. */
static inline unsigned rmoe_cuda_warp_rows(int64_t rows)
{
	const int64_t per = RMOE_CUDA_THREADS / RMOE_WARP;
	return rmoe_cuda_rows((rows + per - 1) / per);
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
 * first + count) of pair_order, n_pairs pairs of K per token, without
 * atomics: in slice order per token, fp32 sums rounded as the CPU
 * kernel's (rmoe_kernel_scatter_add, expert.c's saxpy of the rows' dx), so
 * bit-identical run after run whatever the order blocks run in. index is
 * device scratch of n_pairs int32 (rmoe_cuda_rows_add_scratch).
 * cuda_rows.cu. */
int rmoe_cuda_rows_add(cudaStream_t s, int bf16, int64_t H, int64_t K, int64_t n_pairs, int64_t first,
                       int64_t count, const void *rows, const int32_t *order, const float *w, void *dst,
                       int32_t *index);

#endif /* RMOE_CUDA_COMMON_CUH */
