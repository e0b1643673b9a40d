/* The host side of the cuda-host test (shim/rmoe_cuda_host.h): kernel
 * launches as blocks of cooperative fibers, and the CUDA runtime and
 * cuBLAS entry points the launchers of codelets/kernels/ call, on host
 * memory. cublasGemmEx is a column-major CBLAS GEMM with cuBLAS's argument
 * checks, bf16 operands widened to fp32 and the result rounded back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <random>
#include <vector>

#include <cblas.h>

#include "rmoe_cuda_host.h"

/* The handle and stream types are opaque in the toolkit's headers. */
struct cublasContext {
	cudaStream_t stream;
};
struct CUstream_st {
	int unused;
};

uint3 rmoe_host_thread_idx, rmoe_host_block_idx;
dim3 rmoe_host_block_dim, rmoe_host_grid_dim;

static cudaError_t last_error = cudaSuccess;
static unsigned schedule_seed;
static int fail_launch_in, fail_gemm_in, fail_malloc_in;
static cublasStatus_t fail_gemm_status;
static struct rmoe_cuda_host_counts counts;
static rmoe_cuda_host_gemm_hook gemm_hook;

/* Counts down an injected failure: 1 when this call is the one to fail. */
static int due(int *in)
{
	return *in > 0 && --*in == 0;
}

extern "C" void rmoe_cuda_host_schedule(unsigned seed)
{
	schedule_seed = seed;
}

extern "C" void rmoe_cuda_host_fail_launch(int n)
{
	fail_launch_in = n;
}

extern "C" void rmoe_cuda_host_fail_gemm(int n, cublasStatus_t status)
{
	fail_gemm_in = n;
	fail_gemm_status = status;
}

extern "C" void rmoe_cuda_host_fail_malloc(int n)
{
	fail_malloc_in = n;
}

extern "C" void rmoe_cuda_host_counts(struct rmoe_cuda_host_counts *c)
{
	*c = counts;
}

extern "C" void rmoe_cuda_host_reset_counts(void)
{
	memset(&counts, 0, sizeof(counts));
}

extern "C" void rmoe_cuda_host_on_gemm(rmoe_cuda_host_gemm_hook hook)
{
	gemm_hook = hook;
}

/* ---- fibers ----------------------------------------------------------------------- */

enum fiber_state { RUNNING, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE };

struct fiber {
	ucontext_t ctx;
	char *stack;
	enum fiber_state state;
	uint3 idx;
	unsigned linear;
};

#define FIBER_STACK (128 * 1024)
#define WARP 32

static ucontext_t scheduler;
/* The threads of the block running: fibers[0, nfibers); stacks kept. */
static std::vector<fiber> fibers;
static size_t nfibers;
static fiber *current;
static const std::function<void()> *body_now;
static uint32_t shfl_slot[1024];

static void fiber_main(void)
{
	(*body_now)();
	current->state = DONE;
	/* uc_link resumes the scheduler. */
}

static void wait_at(enum fiber_state barrier)
{
	current->state = barrier;
	swapcontext(&current->ctx, &scheduler);
}

extern "C" void rmoe_host_syncthreads(void)
{
	wait_at(AT_BLOCK_BARRIER);
}

extern "C" uint32_t rmoe_host_shfl_down(uint32_t v, unsigned delta)
{
	const unsigned me = current->linear, lane = me % WARP, nthreads = (unsigned)nfibers;
	shfl_slot[me] = v;
	wait_at(AT_WARP_BARRIER);
	const uint32_t got = lane + delta < WARP && me + delta < nthreads ? shfl_slot[me + delta] : v;
	wait_at(AT_WARP_BARRIER);
	return got;
}

/* Lets every fiber run until it ends or waits at a barrier, then opens the
 * barriers all their threads reached: the block's, or a warp's. */
static void run_block(const std::vector<unsigned> &order)
{
	for (;;) {
		for (unsigned t : order)
			if (fibers[t].state == RUNNING) {
				current = &fibers[t];
				rmoe_host_thread_idx = current->idx;
				swapcontext(&scheduler, &current->ctx);
			}
		size_t live = 0, at_block = 0;
		for (size_t t = 0; t < nfibers; t++) {
			live += fibers[t].state != DONE;
			at_block += fibers[t].state == AT_BLOCK_BARRIER;
		}
		if (live == 0)
			return;
		int opened = 0;
		if (at_block == live) {
			for (size_t t = 0; t < nfibers; t++)
				if (fibers[t].state == AT_BLOCK_BARRIER)
					fibers[t].state = RUNNING;
			opened = 1;
		}
		for (size_t w = 0; !opened && w < nfibers; w += WARP) {
			size_t wl = 0, wa = 0;
			for (size_t t = w; t < w + WARP && t < nfibers; t++) {
				wl += fibers[t].state != DONE;
				wa += fibers[t].state == AT_WARP_BARRIER;
			}
			if (wl > 0 && wa == wl) {
				for (size_t t = w; t < w + WARP && t < nfibers; t++)
					if (fibers[t].state == AT_WARP_BARRIER)
						fibers[t].state = RUNNING;
				opened = 1;
			}
		}
		if (!opened) {
			fprintf(stderr, "cuda-host: block (%u, %u, %u): threads wait at barriers none can pass "
			                "(a __syncthreads or shuffle not reached by all)\n",
			        rmoe_host_block_idx.x, rmoe_host_block_idx.y, rmoe_host_block_idx.z);
			abort();
		}
	}
}

extern "C" void rmoe_cuda_host_release(void)
{
	for (fiber &f : fibers)
		free(f.stack);
	fibers.clear();
	nfibers = 0;
}

/* Apart: getcontext returns twice, which would have the compiler keep the
 * launch's locals in memory. */
static __attribute__((noinline)) void start_fiber(fiber *f)
{
	getcontext(&f->ctx);
	f->ctx.uc_stack.ss_sp = f->stack;
	f->ctx.uc_stack.ss_size = FIBER_STACK;
	f->ctx.uc_link = &scheduler;
	makecontext(&f->ctx, fiber_main, 0);
}

static int config_ok(dim3 g, dim3 b, size_t shmem)
{
	const unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
	return threads >= 1 && threads <= 1024 && b.z <= 64 && g.x >= 1 && g.x <= 0x7fffffffu && g.y >= 1 &&
	       g.y <= 65535 && g.z >= 1 && g.z <= 65535 && shmem <= 48 * 1024;
}

void rmoe_host_launch(dim3 grid, dim3 block, size_t shmem, cudaStream_t s, std::function<void()> body)
{
	(void)s;
	counts.launches++;
	if (!config_ok(grid, block, shmem)) {
		last_error = cudaErrorInvalidConfiguration;
		return;
	}
	if (due(&fail_launch_in)) {
		last_error = cudaErrorLaunchFailure;
		return;
	}
	const unsigned nthreads = block.x * block.y * block.z;
	const unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z;
	if (fibers.size() < nthreads)
		fibers.resize(nthreads);
	nfibers = nthreads;
	for (unsigned t = 0; t < nthreads; t++)
		if (!fibers[t].stack && !(fibers[t].stack = (char *)malloc(FIBER_STACK))) {
			fprintf(stderr, "cuda-host: no memory for %u threads' stacks\n", nthreads);
			abort();
		}
	std::vector<unsigned long long> blocks(nblocks);
	std::vector<unsigned> threads(nthreads);
	for (unsigned long long i = 0; i < nblocks; i++)
		blocks[i] = i;
	for (unsigned i = 0; i < nthreads; i++)
		threads[i] = i;
	std::mt19937 rng(schedule_seed);
	if (schedule_seed)
		std::shuffle(blocks.begin(), blocks.end(), rng);
	rmoe_host_grid_dim = grid;
	rmoe_host_block_dim = block;
	body_now = &body;
	for (unsigned long long bl : blocks) {
		rmoe_host_block_idx = make_uint3((unsigned)(bl % grid.x), (unsigned)(bl / grid.x % grid.y),
		                                 (unsigned)(bl / grid.x / grid.y));
		if (schedule_seed)
			std::shuffle(threads.begin(), threads.end(), rng);
		for (unsigned t = 0; t < nthreads; t++) {
			fiber &f = fibers[t];
			f.state = RUNNING;
			f.linear = t;
			f.idx = make_uint3(t % block.x, t / block.x % block.y, t / block.x / block.y);
			start_fiber(&f);
		}
		run_block(threads);
	}
	body_now = NULL;
	current = NULL;
}

/* ---- the CUDA runtime ---------------------------------------------------------------- */

cudaError_t cudaGetLastError(void)
{
	cudaError_t e = last_error;
	last_error = cudaSuccess;
	return e;
}

cudaError_t cudaPeekAtLastError(void)
{
	return last_error;
}

const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return "no error";
	case cudaErrorInvalidValue:
		return "invalid argument";
	case cudaErrorMemoryAllocation:
		return "out of memory";
	case cudaErrorInvalidConfiguration:
		return "invalid configuration argument";
	case cudaErrorLaunchFailure:
		return "unspecified launch failure";
	default:
		return "cuda-host: an error";
	}
}

cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s)
{
	(void)s;
	counts.mallocs++;
	*p = NULL;
	if (due(&fail_malloc_in))
		return cudaErrorMemoryAllocation;
	const size_t b = (bytes + 255) / 256 * 256;
	if (!(*p = aligned_alloc(256, b > 0 ? b : 256)))
		return cudaErrorMemoryAllocation;
	counts.malloc_bytes += bytes;
	return cudaSuccess;
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
	(void)s;
	free(p);
	return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s)
{
	(void)s;
	if (bytes && !p)
		return cudaErrorInvalidValue;
	memset(p, value, bytes);
	return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s)
{
	(void)kind;
	(void)s;
	if (bytes && (!dst || !src))
		return cudaErrorInvalidValue;
	memmove(dst, src, bytes);
	return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
	*s = (cudaStream_t)calloc(1, sizeof(struct CUstream_st));
	return *s ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	free(s);
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	(void)s;
	return cudaSuccess;
}

/* ---- cuBLAS --------------------------------------------------------------------------- */

cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
	*h = (cublasHandle_t)calloc(1, sizeof(struct cublasContext));
	return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	free(h);
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	h->stream = s;
	return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t st)
{
	switch (st) {
	case CUBLAS_STATUS_SUCCESS:
		return "CUBLAS_STATUS_SUCCESS";
	case CUBLAS_STATUS_NOT_INITIALIZED:
		return "CUBLAS_STATUS_NOT_INITIALIZED";
	case CUBLAS_STATUS_ALLOC_FAILED:
		return "CUBLAS_STATUS_ALLOC_FAILED";
	case CUBLAS_STATUS_INVALID_VALUE:
		return "CUBLAS_STATUS_INVALID_VALUE";
	case CUBLAS_STATUS_EXECUTION_FAILED:
		return "CUBLAS_STATUS_EXECUTION_FAILED";
	case CUBLAS_STATUS_NOT_SUPPORTED:
		return "CUBLAS_STATUS_NOT_SUPPORTED";
	default:
		return "CUBLAS_STATUS (another)";
	}
}

/* A column-major rows x cols matrix of type t at p (leading dimension ld)
 * as fp32, packed (leading dimension rows). */
static std::vector<float> widen(const void *p, cudaDataType t, int rows, int cols, int ld)
{
	std::vector<float> f((size_t)rows * cols);
	for (int c = 0; c < cols; c++)
		for (int r = 0; r < rows; r++) {
			const size_t at = (size_t)c * ld + r;
			f[(size_t)c * rows + r] = t == CUDA_R_32F ? ((const float *)p)[at]
			                                          : __bfloat162float(((const __nv_bfloat16 *)p)[at]);
		}
	return f;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                            cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
	(void)algo;
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	counts.gemms++;
	if (due(&fail_gemm_in))
		return fail_gemm_status;
	if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
		return CUBLAS_STATUS_INVALID_VALUE;
	const int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
	const int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
	if (m < 0 || n < 0 || k < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m) ||
	    !alpha || !beta)
		return CUBLAS_STATUS_INVALID_VALUE;
	const int f32 = at == CUDA_R_32F && bt == CUDA_R_32F && ct == CUDA_R_32F;
	const int b16 = at == CUDA_R_16BF && bt == CUDA_R_16BF && ct == CUDA_R_16BF;
	if (!(f32 || b16) || compute != CUBLAS_COMPUTE_32F)
		return CUBLAS_STATUS_NOT_SUPPORTED;
	const float a = *(const float *)alpha, b = *(const float *)beta;
	if (gemm_hook)
		gemm_hook(ta, tb, m, n, k, lda, ldb, ldc, at, bt, ct, b);
	if (m == 0 || n == 0)
		return CUBLAS_STATUS_SUCCESS;
	if ((k > 0 && (!A || !B)) || !C)
		return CUBLAS_STATUS_INVALID_VALUE;
	const CBLAS_TRANSPOSE cta = ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
	const CBLAS_TRANSPOSE ctb = tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
	if (f32) {
		cblas_sgemm(CblasColMajor, cta, ctb, m, n, k, a, (const float *)A, lda, (const float *)B, ldb, b, (float *)C,
		            ldc);
		return CUBLAS_STATUS_SUCCESS;
	}
	std::vector<float> af = widen(A, at, a_rows, a_cols, lda), bf = widen(B, bt, b_rows, b_cols, ldb);
	std::vector<float> cf = b != 0.0f ? widen(C, ct, m, n, ldc) : std::vector<float>((size_t)m * n, 0.0f);
	cblas_sgemm(CblasColMajor, cta, ctb, m, n, k, a, af.data(), std::max(1, a_rows), bf.data(), std::max(1, b_rows),
	            b, cf.data(), m);
	for (int c = 0; c < n; c++)
		for (int r = 0; r < m; r++)
			((__nv_bfloat16 *)C)[(size_t)c * ldc + r] = __float2bfloat16_rn(cf[(size_t)c * m + r]);
	return CUBLAS_STATUS_SUCCESS;
}
