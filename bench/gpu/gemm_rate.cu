/* The cuBLAS bf16 GEMM rate of the card, the yardstick of the GPU results
 * (bench/gpu/run.sh): a large square GEMM, and the GEMMs one expert of the
 * layer issues in a forward and backward with recomputation, in the shapes,
 * transposes and calls of the CUDA codelets (rmoe_gemm_rm: cublasGemmEx,
 * bf16 storage, fp32 accumulation). Seeded random operands, not zeros (a
 * tensor core's rate depends on the data). CUDA events around many calls
 * after warm-up calls.
 *
 *   rmoe_gemm_rate [--hidden H] [--ffn F] [--rows R] [--square N] [--repeat N] [--csv FILE]
 *
 * Exits 77 where there is no CUDA device. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

__global__ void fill_k(int64_t n, uint64_t seed, float scale, rmoe_bf16_t *p)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		uint64_t z = seed + (uint64_t)i * 0x9e3779b97f4a7c15ull;
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		z ^= z >> 31;
		p[i] = __float2bfloat16(scale * ((float)(z >> 40) * 0x1p-24f * 2.0f - 1.0f));
	}
}

struct gemm {
	const char *what;
	int ta, tb;
	int64_t m, n, k;
	int a, b, c; /* operand buffers: 0 rows [R,H], 1 wide [R,F], 2 weight [H,F] or [F,H], 3 out [R,H], 4 dw [H,F] */
	float beta;
};

static int64_t parse(const char *opt, const char *v, int64_t lo)
{
	char *end;
	errno = 0;
	long long x = strtoll(v, &end, 10);
	if (errno || *end || x < lo) {
		fprintf(stderr, "rmoe_gemm_rate: %s '%s': expected an integer >= %lld\n", opt, v, (long long)lo);
		exit(2);
	}
	return x;
}

/* Mean time of one pass over list (n GEMMs), in microseconds. */
static double time_list(cublasHandle_t h, cudaStream_t s, const struct gemm *list, int n, void *buf[5], int repeat,
                        int *rc)
{
	cudaEvent_t e0, e1;
	cudaEventCreate(&e0);
	cudaEventCreate(&e1);
	for (int w = 0; w < 3 + repeat && !*rc; w++) {
		if (w == 3)
			cudaEventRecord(e0, s);
		for (int i = 0; i < n && !*rc; i++) {
			const struct gemm *g = &list[i];
			const int64_t lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
			*rc = rmoe_gemm_rm(h, g->ta, g->tb, g->m, g->n, g->k, 1.0f, buf[g->a], CUDA_R_16BF, lda, buf[g->b],
			                   CUDA_R_16BF, ldb, g->beta, buf[g->c], CUDA_R_16BF, g->n);
		}
	}
	cudaEventRecord(e1, s);
	float ms = 0;
	if (!*rc)
		*rc = rmoe_cuda_ok(cudaEventSynchronize(e1), "event") || rmoe_cuda_ok(cudaEventElapsedTime(&ms, e0, e1), "time");
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	return 1e3 * ms / repeat;
}

static double flops_of(const struct gemm *list, int n)
{
	double f = 0;
	for (int i = 0; i < n; i++)
		f += 2.0 * list[i].m * list[i].n * list[i].k;
	return f;
}

int main(int argc, char **argv)
{
	int64_t H = 2048, F = 768, R = 4096, N = 8192, repeat = 20;
	const char *csv = NULL;
	for (int i = 1; i < argc; i++) {
		const char *o = argv[i];
		if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
			printf("usage: rmoe_gemm_rate [--hidden H] [--ffn F] [--rows R] [--square N] [--repeat N] [--csv FILE]\n"
			       "cuBLAS bf16 GEMM rate (fp32 accumulation): an N^3 GEMM, and the GEMMs of one expert's\n"
			       "forward and backward with recomputation over R rows, as the CUDA codelets issue them.\n"
			       "Defaults: the Qwen3-30B-A3B layer (H=2048, F=768) at T=65536, K=8, E=128 (R=4096), N=8192.\n");
			return 0;
		}
		if (i + 1 >= argc) {
			fprintf(stderr, "rmoe_gemm_rate: %s needs a value (see --help)\n", o);
			return 2;
		}
		const char *v = argv[++i];
		if (!strcmp(o, "--hidden")) H = parse(o, v, 1);
		else if (!strcmp(o, "--ffn")) F = parse(o, v, 1);
		else if (!strcmp(o, "--rows")) R = parse(o, v, 1);
		else if (!strcmp(o, "--square")) N = parse(o, v, 16);
		else if (!strcmp(o, "--repeat")) repeat = parse(o, v, 1);
		else if (!strcmp(o, "--csv")) csv = v;
		else {
			fprintf(stderr, "rmoe_gemm_rate: unknown option %s (see --help)\n", o);
			return 2;
		}
	}
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		fprintf(stderr, "rmoe_gemm_rate: no CUDA device: skipped\n");
		return 77;
	}
	cudaDeviceProp prop;
	cudaGetDeviceProperties(&prop, 0);
	cudaStream_t s;
	cublasHandle_t h;
	int rc = rmoe_cuda_ok(cudaStreamCreate(&s), "stream") || rmoe_cublas_ok(cublasCreate(&h), "cublasCreate") ||
	         rmoe_cublas_ok(cublasSetStream(h, s), "cublasSetStream");
	/* One expert of the layer over R rows (cuda_expert.cu): forward gate, up,
	 * down; the recompute's gate, up; the backward's u = dy w_down^T,
	 * dw_down, dw_gate, dw_up, and dx through w_gate and w_up. */
	const struct gemm expert[] = {
		{"fwd gate", 0, 0, R, F, H, 0, 2, 1, 0}, {"fwd up", 0, 0, R, F, H, 0, 2, 1, 0},
		{"fwd down", 0, 0, R, H, F, 1, 2, 3, 0}, {"recompute gate", 0, 0, R, F, H, 0, 2, 1, 0},
		{"recompute up", 0, 0, R, F, H, 0, 2, 1, 0}, {"bwd u", 0, 1, R, F, H, 3, 2, 1, 0},
		{"bwd dw_down", 1, 0, F, H, R, 1, 3, 4, 1}, {"bwd dw_gate", 1, 0, H, F, R, 0, 1, 4, 1},
		{"bwd dw_up", 1, 0, H, F, R, 0, 1, 4, 1}, {"bwd dx gate", 0, 1, R, H, F, 1, 2, 3, 0},
		{"bwd dx up", 0, 1, R, H, F, 1, 2, 3, 1},
	};
	const int nexp = (int)(sizeof(expert) / sizeof(expert[0]));
	const struct gemm square[] = {{"square", 0, 0, N, N, N, 0, 1, 2, 0}};
	/* Buffers large enough for either list. */
	const int64_t big = N * N > R * (H > F ? H : F) ? N * N : R * (H > F ? H : F);
	void *buf[5] = {NULL};
	for (int i = 0; i < 5 && !rc; i++) {
		rc = rmoe_cuda_ok(cudaMalloc(&buf[i], (size_t)(big > H * F ? big : H * F) * sizeof(rmoe_bf16_t)), "cudaMalloc");
		if (!rc)
			fill_k<<<rmoe_cuda_blocks(big), RMOE_CUDA_THREADS, 0, s>>>(big, 1000 + i, 0.05f, (rmoe_bf16_t *)buf[i]);
	}
	double us_sq = 0, us_exp = 0;
	if (!rc)
		us_sq = time_list(h, s, square, 1, buf, repeat, &rc);
	if (!rc)
		us_exp = time_list(h, s, expert, nexp, buf, repeat * 5, &rc);
	if (rc) {
		fprintf(stderr, "rmoe_gemm_rate: a CUDA or cuBLAS call failed\n");
		return 1;
	}
	const double tf_sq = flops_of(square, 1) / us_sq * 1e-6, tf_exp = flops_of(expert, nexp) / us_exp * 1e-6;
	printf("device: %s\n", prop.name);
	printf("square %lldx%lldx%lld bf16: %.1f us, %.0f TFLOP/s\n", (long long)N, (long long)N, (long long)N, us_sq,
	       tf_sq);
	printf("expert mix (%d GEMMs, R=%lld H=%lld F=%lld) bf16: %.1f us, %.0f TFLOP/s\n", nexp, (long long)R,
	       (long long)H, (long long)F, us_exp, tf_exp);
	if (csv) {
		FILE *f = fopen(csv, "w");
		if (!f) {
			fprintf(stderr, "rmoe_gemm_rate: cannot write %s: %s\n", csv, strerror(errno));
			return 1;
		}
		fprintf(f, "case,device,m,n,k,gemms,us,tflops\n");
		fprintf(f, "square,%s,%lld,%lld,%lld,1,%.2f,%.1f\n", prop.name, (long long)N, (long long)N, (long long)N,
		        us_sq, tf_sq);
		fprintf(f, "expert_mix,%s,%lld,%lld,%lld,%d,%.2f,%.1f\n", prop.name, (long long)R, (long long)H,
		        (long long)F, nexp, us_exp, tf_exp);
		fclose(f);
	}
	for (int i = 0; i < 5; i++)
		cudaFree(buf[i]);
	cublasDestroy(h);
	cudaStreamDestroy(s);
	return 0;
}
