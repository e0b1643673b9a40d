/* The host side of the cuda-host test (shim/rmoe_cuda_host.h): kernel
 * launches as blocks of cooperative fibers, and the CUDA runtime and
 * cuBLAS entry points the launchers of codelets/kernels/ call, on host
 * memory. cublasGemmEx is a column-major CBLAS GEMM with cuBLAS's argument
 * checks, bf16 operands widened to fp32 and the result rounded back;
 * cublasGemmStridedBatchedEx and cublasGemmGroupedBatchedEx are the same
 * GEMM per problem, as cuBLAS documents their problems. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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
struct CUevent_st {
	double ms;
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
/* The stacks go back at exit, before the vector that holds them does
 * (destroyed in reverse order of definition), so that LeakSanitizer, which
 * looks after the static destructors, finds none. */
static struct fiber_stacks_release {
	~fiber_stacks_release()
	{
		for (fiber &f : fibers)
			free(f.stack);
	}
} release_fiber_stacks;
static fiber *current;
static const std::function<void()> *body_now;
static uint64_t shfl_slot[1024];

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

extern "C" uint64_t rmoe_host_shfl(uint64_t v, enum rmoe_host_shfl_kind kind, unsigned arg)
{
	const unsigned me = current->linear, lane = me % WARP, base = me - lane, nthreads = (unsigned)nfibers;
	const unsigned from = kind == RMOE_HOST_SHFL_DOWN ? lane + arg : kind == RMOE_HOST_SHFL_XOR ? lane ^ arg : arg;
	shfl_slot[me] = v;
	wait_at(AT_WARP_BARRIER);
	const uint64_t got = from < WARP && base + from < nthreads ? shfl_slot[base + from] : v;
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

cudaError_t cudaMalloc(void **p, size_t bytes)
{
	const size_t b = (bytes + 255) / 256 * 256;
	*p = aligned_alloc(256, b > 0 ? b : 256);
	return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void *p)
{
	free(p);
	return cudaSuccess;
}

/* One device, named as what it is (bench/gpu/gemm_rate.cu prints it). */
cudaError_t cudaGetDeviceCount(int *n)
{
	*n = 1;
	return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
	if (device != 0)
		return cudaErrorInvalidValue;
	memset(prop, 0, sizeof(*prop));
	snprintf(prop->name, sizeof(prop->name), "cuda-host shim");
	return cudaSuccess;
}

/* Events: the host's clock when recorded (every call is done when it
 * returns). */
cudaError_t cudaEventCreate(cudaEvent_t *e)
{
	*e = (cudaEvent_t)calloc(1, sizeof(struct CUevent_st));
	return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	(void)s;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	e->ms = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
	return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
	(void)e;
	return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
	*ms = (float)(end->ms - start->ms);
	return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	free(e);
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

/* The type combinations of CUBLAS_COMPUTE_32F the launchers use, as
 * cuBLAS's tables list them: fp32 throughout, bf16 throughout, and bf16
 * operands into an fp32 C (cublasGemmEx and its strided batches; the
 * grouped call's table has no mixed row). */
static int types_ok(cudaDataType at, cudaDataType bt, cudaDataType ct, cublasComputeType_t compute, int mixed_ok)
{
	const int f32 = at == CUDA_R_32F && bt == CUDA_R_32F && ct == CUDA_R_32F;
	const int b16 = at == CUDA_R_16BF && bt == CUDA_R_16BF && ct == CUDA_R_16BF;
	const int mixed = mixed_ok && at == CUDA_R_16BF && bt == CUDA_R_16BF && ct == CUDA_R_32F;
	return (f32 || b16 || mixed) && compute == CUBLAS_COMPUTE_32F;
}

/* cuBLAS's argument checks of one problem. */
static int args_ok(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, int lda, int ldb, int ldc)
{
	if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
		return 0;
	const int a_rows = ta == CUBLAS_OP_N ? m : k, b_rows = tb == CUBLAS_OP_N ? k : n;
	return m >= 0 && n >= 0 && k >= 0 && lda >= std::max(1, a_rows) && ldb >= std::max(1, b_rows) &&
	       ldc >= std::max(1, m);
}

/* One column-major GEMM, its arguments checked: through CBLAS, bf16
 * operands widened to fp32, C computed in fp32 (beta C included) and
 * rounded once to its type. */
static cublasStatus_t gemm_one(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float a, const void *A,
                               cudaDataType at, int lda, const void *B, cudaDataType bt, int ldb, float b, void *C,
                               cudaDataType ct, int ldc)
{
	if (gemm_hook)
		gemm_hook(ta, tb, m, n, k, lda, ldb, ldc, at, bt, ct, b);
	if (m == 0 || n == 0)
		return CUBLAS_STATUS_SUCCESS;
	if ((k > 0 && (!A || !B)) || !C)
		return CUBLAS_STATUS_INVALID_VALUE;
	const CBLAS_TRANSPOSE cta = ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
	const CBLAS_TRANSPOSE ctb = tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
	if (at == CUDA_R_32F && ct == CUDA_R_32F) {
		cblas_sgemm(CblasColMajor, cta, ctb, m, n, k, a, (const float *)A, lda, (const float *)B, ldb, b, (float *)C,
		            ldc);
		return CUBLAS_STATUS_SUCCESS;
	}
	const int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
	const int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
	std::vector<float> af = widen(A, at, a_rows, a_cols, lda), bf = widen(B, bt, b_rows, b_cols, ldb);
	std::vector<float> cf = b != 0.0f ? widen(C, ct, m, n, ldc) : std::vector<float>((size_t)m * n, 0.0f);
	cblas_sgemm(CblasColMajor, cta, ctb, m, n, k, a, af.data(), std::max(1, a_rows), bf.data(), std::max(1, b_rows),
	            b, cf.data(), m);
	for (int c = 0; c < n; c++)
		for (int r = 0; r < m; r++) {
			const float v = cf[(size_t)c * m + r];
			if (ct == CUDA_R_32F)
				((float *)C)[(size_t)c * ldc + r] = v;
			else
				((__nv_bfloat16 *)C)[(size_t)c * ldc + r] = __float2bfloat16_rn(v);
		}
	return CUBLAS_STATUS_SUCCESS;
}

/* What every call checks first: the handle, then an injected failure. */
static cublasStatus_t call_start(cublasHandle_t h, cublasStatus_t *st)
{
	if (!h)
		return *st = CUBLAS_STATUS_NOT_INITIALIZED;
	counts.gemms++;
	if (due(&fail_gemm_in))
		return *st = fail_gemm_status;
	return *st = CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                            cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
	(void)algo;
	cublasStatus_t st;
	if (call_start(h, &st))
		return st;
	if (!args_ok(ta, tb, m, n, k, lda, ldb, ldc) || !alpha || !beta)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (!types_ok(at, bt, ct, compute, 1))
		return CUBLAS_STATUS_NOT_SUPPORTED;
	return gemm_one(ta, tb, m, n, k, *(const float *)alpha, A, at, lda, B, bt, ldb, *(const float *)beta, C, ct, ldc);
}

/* Problem i: A + i*strideA, B + i*strideB, C + i*strideC (elements). */
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                          long long strideA, const void *B, cudaDataType bt, int ldb,
                                          long long strideB, const void *beta, void *C, cudaDataType ct, int ldc,
                                          long long strideC, int batch, cublasComputeType_t compute,
                                          cublasGemmAlgo_t algo)
{
	(void)algo;
	cublasStatus_t st;
	if (call_start(h, &st))
		return st;
	if (!args_ok(ta, tb, m, n, k, lda, ldb, ldc) || batch < 0 || !alpha || !beta)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (!types_ok(at, bt, ct, compute, 1))
		return CUBLAS_STATUS_NOT_SUPPORTED;
	const size_t as = at == CUDA_R_32F ? 4 : 2, bs = bt == CUDA_R_32F ? 4 : 2, cs = ct == CUDA_R_32F ? 4 : 2;
	for (int i = 0; i < batch && !st; i++)
		st = gemm_one(ta, tb, m, n, k, *(const float *)alpha, (const char *)A + as * (size_t)(i * strideA), at, lda,
		              (const char *)B + bs * (size_t)(i * strideB), bt, ldb, *(const float *)beta,
		              (char *)C + cs * (size_t)(i * strideC), ct, ldc);
	return st;
}

/* group_count groups, group i of group_size[i] problems sharing its
 * operations, sizes, leading dimensions, alpha_array[i] and beta_array[i]
 * (host arrays, host pointer mode); the problems' matrices at Aarray[p],
 * Barray[p], Carray[p] (device arrays), the problems of group 0 first.
 * Every argument is checked before any problem is computed. */
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t ta[], const cublasOperation_t tb[],
                                          const int m[], const int n[], const int k[], const void *alpha,
                                          const void *const A[], cudaDataType_t at, const int lda[],
                                          const void *const B[], cudaDataType_t bt, const int ldb[], const void *beta,
                                          void *const C[], cudaDataType_t ct, const int ldc[], int group_count,
                                          const int group_size[], cublasComputeType_t compute)
{
	cublasStatus_t st;
	if (call_start(h, &st))
		return st;
	if (group_count < 0 || (group_count > 0 && (!ta || !tb || !m || !n || !k || !lda || !ldb || !ldc || !alpha ||
	                                            !beta || !group_size || !A || !B || !C)))
		return CUBLAS_STATUS_INVALID_VALUE;
	for (int g = 0; g < group_count; g++)
		if (group_size[g] < 0 || !args_ok(ta[g], tb[g], m[g], n[g], k[g], lda[g], ldb[g], ldc[g]))
			return CUBLAS_STATUS_INVALID_VALUE;
	if (!types_ok(at, bt, ct, compute, 0))
		return CUBLAS_STATUS_NOT_SUPPORTED;
	for (int g = 0, p = 0; g < group_count && !st; g++)
		for (int i = 0; i < group_size[g] && !st; i++, p++)
			st = gemm_one(ta[g], tb[g], m[g], n[g], k[g], ((const float *)alpha)[g], A[p], at, lda[g], B[p], bt, ldb[g],
			              ((const float *)beta)[g], C[p], ct, ldc[g]);
	return st;
}
