/* The cuBLAS bf16 GEMM rate of the card, the yardstick of the GPU results
 * (bench/gpu/run.sh), and the expert GEMM ways of the CUDA launchers
 * (codelets/kernels/cuda_gemm.cuh) against each other. Seeded random
 * operands, not zeros (a tensor core's rate depends on the data); CUDA
 * events around many passes after warm-up passes. Cases (CSV rows):
 *   square            an N^3 GEMM (rmoe_gemm_rm: cublasGemmEx, bf16
 *                     storage, fp32 accumulation);
 *   expert_mix        the 11 GEMMs one expert issues in a forward and
 *                     backward with recomputation, at R rows, one
 *                     cublasGemmEx each: the former per-expert rate;
 *   gemms_WAY         those GEMMs for a partition of NE experts of about R
 *                     rows each (spread +-SKEW), 8 calls through the
 *                     launchers' own plan, for WAY = grouped, strided
 *                     (its padding copies included), loop;
 *   gemms_strided_nopad  the strided calls alone at exactly R rows per
 *                     expert, where the rows need no padding: the bound
 *                     of the strided way;
 *   hbm_copy          a device-to-device copy of the partition's rows
 *                     (cudaMemcpyAsync), read and write counted: the
 *                     bandwidth the row kernels are read against (gbps);
 *   hop_WAY           one hop's expert tasks as the CUDA codelets run them
 *                     (rmoe_cuda_expert_ffn, its recompute, and
 *                     rmoe_cuda_expert_bwd_pairs with the dx addition at
 *                     one pair per token): the GEMMs and the elementwise
 *                     kernels between them, 22 GEMMs' worth of flops per
 *                     row, the in-task rate the codelets can reach.
 * The fastest gemms_ way is printed last ("fastest: WAY"); run.sh passes
 * it to the layer's runs as RMOE_CUDA_GEMM.
 *
 *   rmoe_gemm_rate [--hidden H] [--ffn F] [--rows R] [--experts NE] [--skew S]
 *                  [--square N] [--repeat N] [--csv FILE]
 *
 * Exits 77 where there is no CUDA device. The cuda-host test runs it on
 * the host (tests/cuda-host/) at a tiny size: every call it makes. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_gemm.cuh"

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

/* One pair per token (a ring hop's slice holds about one of each token's
 * K pairs): pair i*K of token i, weight in [0.5, 1). */
__global__ void hop_pairs_k(int64_t m, int64_t K, int32_t *order, float *topk_w)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m; i += (int64_t)gridDim.x * blockDim.x) {
		order[i] = (int32_t)(i * K);
		for (int64_t k = 0; k < K; k++)
			topk_w[i * K + k] = 0.5f + 0.5f * (float)((i * 7 + k * 13) % 64) / 64.0f;
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

/* Events around repeat passes of a pass function, after 3 warm-up passes;
 * before each timed pass an untimed prologue (may be NULL). The mean of a
 * pass, in microseconds. */
struct timer {
	cudaStream_t s;
	cudaEvent_t e0, e1;
};

template <typename P, typename Q> static double timed(struct timer *t, int repeat, P pass, Q prologue, int *rc)
{
	float total = 0.0f;
	for (int w = 0; w < 3 + repeat && !*rc; w++) {
		*rc = prologue();
		if (!*rc)
			*rc = rmoe_cuda_ok(cudaEventRecord(t->e0, t->s), "event");
		if (!*rc)
			*rc = pass();
		if (!*rc)
			*rc = rmoe_cuda_ok(cudaEventRecord(t->e1, t->s), "event");
		float ms = 0.0f;
		if (!*rc)
			*rc = rmoe_cuda_ok(cudaEventSynchronize(t->e1), "event") ||
			      rmoe_cuda_ok(cudaEventElapsedTime(&ms, t->e0, t->e1), "time");
		if (w >= 3)
			total += ms;
	}
	return 1e3 * total / repeat;
}

static double flops_of(const struct gemm *list, int n)
{
	double f = 0;
	for (int i = 0; i < n; i++)
		f += 2.0 * list[i].m * list[i].n * list[i].k;
	return f;
}

struct row {
	const char *name;
	int64_t m;
	int gemms;
	double us, flops, bytes;
};

int main(int argc, char **argv)
{
	int64_t H = 2048, F = 768, R = 4096, N = 8192, NE = 16, repeat = 20;
	double skew = 0.05;
	const char *csv = NULL;
	for (int i = 1; i < argc; i++) {
		const char *o = argv[i];
		if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
			printf("usage: rmoe_gemm_rate [--hidden H] [--ffn F] [--rows R] [--experts NE] [--skew S] [--square N]\n"
			       "                      [--repeat N] [--csv FILE]\n"
			       "cuBLAS bf16 GEMM rate (fp32 accumulation): an N^3 GEMM; the GEMMs of one expert's forward\n"
			       "and backward with recomputation over R rows, a cublasGemmEx each; the same GEMMs for a\n"
			       "partition of NE experts of R rows each (spread +-S) in each way of the expert launchers\n"
			       "(grouped, strided, loop: RMOE_CUDA_GEMM); and one hop's expert tasks in each way.\n"
			       "Defaults: the Qwen3-30B-A3B layer (H=2048, F=768) at T=65536, K=8, E=128 over 8 partitions\n"
			       "(R=4096, NE=16, S=0.05), N=8192. The fastest way is printed last.\n");
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
		else if (!strcmp(o, "--experts")) NE = parse(o, v, 1);
		else if (!strcmp(o, "--square")) N = parse(o, v, 16);
		else if (!strcmp(o, "--repeat")) repeat = parse(o, v, 1);
		else if (!strcmp(o, "--csv")) csv = v;
		else if (!strcmp(o, "--skew")) {
			char *end;
			skew = strtod(v, &end);
			if (*end || !(skew >= 0.0 && skew < 1.0)) {
				fprintf(stderr, "rmoe_gemm_rate: --skew '%s': expected a number in [0, 1)\n", v);
				return 2;
			}
		} else {
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
	struct timer t = {};
	cublasHandle_t h;
	int rc = rmoe_cuda_ok(cudaStreamCreate(&t.s), "stream") || rmoe_cublas_ok(cublasCreate(&h), "cublasCreate") ||
	         rmoe_cublas_ok(cublasSetStream(h, t.s), "cublasSetStream") ||
	         rmoe_cuda_ok(cudaEventCreate(&t.e0), "event") || rmoe_cuda_ok(cudaEventCreate(&t.e1), "event");
	if (rc) {
		fprintf(stderr, "rmoe_gemm_rate: a CUDA or cuBLAS call failed\n");
		return 1;
	}
	auto none = [] { return 0; };
	struct row rows[12];
	int nrows = 0;

	/* One expert of the layer over R rows (cuda_expert.cu's GEMMs, one
	 * cublasGemmEx each): forward gate, up, down; the recompute's gate, up;
	 * the backward's u = dy w_down^T, dw_down, dw_gate, dw_up, and dx
	 * through w_gate and w_up. */
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

	/* The partition: NE experts of R rows on average, spread linearly over
	 * +-skew, M rows in all. */
	int64_t *rpe = (int64_t *)malloc((size_t)NE * sizeof(int64_t)), M = 0;
	for (int64_t e = 0; e < NE && rpe; e++) {
		const double f = NE > 1 ? 2.0 * (double)e / (double)(NE - 1) - 1.0 : 0.0;
		rpe[e] = (int64_t)llround((double)R * (1.0 + skew * f));
		M += rpe[e];
	}
	const int64_t K = 8, W = 3 * NE * H * F;
	/* Buffers: x, dy, out [M, H], work [4, M, F], w and dw [W] (sized for
	 * the square and one expert's list too); pairs for a hop. */
	const int64_t most = M > R * NE ? M : R * NE, rowsH = most * H, big = N * N > rowsH ? N * N : rowsH;
	const int64_t wide = 4 * most * F, wsz = W > N * N ? W : N * N;
	const int64_t sizes[6] = {big, big, wsz, big, wsz, wide > N * N ? wide : N * N};
	void *buf[6] = {NULL};
	int32_t *order = NULL;
	float *topk_w = NULL, *dg = NULL;
	rc = !rpe;
	for (int i = 0; i < 6 && !rc; i++) {
		rc = rmoe_cuda_ok(cudaMalloc(&buf[i], (size_t)sizes[i] * sizeof(rmoe_bf16_t)), "cudaMalloc");
		if (!rc) {
			RMOE_LAUNCH(fill_k, rmoe_cuda_blocks(sizes[i]), RMOE_CUDA_THREADS, 0, t.s, sizes[i], (uint64_t)(1000 + i),
			            0.05f, (rmoe_bf16_t *)buf[i]);
			rc = rmoe_cuda_check("fill");
		}
	}
	if (!rc)
		rc = rmoe_cuda_ok(cudaMalloc(&order, (size_t)M * sizeof(int32_t)), "cudaMalloc") ||
		     rmoe_cuda_ok(cudaMalloc(&topk_w, (size_t)(M * K) * sizeof(float)), "cudaMalloc") ||
		     rmoe_cuda_ok(cudaMalloc(&dg, (size_t)(M * K) * sizeof(float)), "cudaMalloc");
	if (!rc) {
		RMOE_LAUNCH(hop_pairs_k, rmoe_cuda_blocks(M), RMOE_CUDA_THREADS, 0, t.s, M, K, order, topk_w);
		rc = rmoe_cuda_check("pairs");
	}
	/* buf: 0 x (or the square's A), 1 dy / wide of one expert, 2 w, 3 out, 4 dw, 5 work. */
	auto list_pass = [&](const struct gemm *list, int n) {
		return [=, &h]() {
			int r = 0;
			for (int i = 0; i < n && !r; i++) {
				const struct gemm *g = &list[i];
				const int64_t lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
				const int ia = g->a == 1 ? 5 : g->a, ib = g->b == 1 ? 5 : g->b, ic = g->c == 1 ? 5 : g->c;
				r = rmoe_gemm_rm(h, g->ta, g->tb, g->m, g->n, g->k, 1.0f, buf[ia], CUDA_R_16BF, lda, buf[ib],
				                 CUDA_R_16BF, ldb, g->beta, buf[ic], CUDA_R_16BF, g->n);
			}
			return r;
		};
	};
	if (!rc)
		rows[nrows++] = {"square", N, 1, timed(&t, (int)repeat, list_pass(square, 1), none, &rc), flops_of(square, 1),
		                 0.0};
	if (!rc)
		rows[nrows++] = {"expert_mix", R, nexp, timed(&t, (int)repeat * 5, list_pass(expert, nexp), none, &rc),
		                 flops_of(expert, nexp), 0.0};

	/* The partition's calls, as the launchers make them (cuda_expert.cu):
	 * forward gate+up and down, the recompute's gate+up, then the
	 * backward's u, dw_down, dw_gate+up, dx gate, dx up. */
	const size_t es = sizeof(rmoe_bf16_t);
	rmoe_bf16_t *x = (rmoe_bf16_t *)buf[0], *dy = (rmoe_bf16_t *)buf[1], *out = (rmoe_bf16_t *)buf[3];
	rmoe_bf16_t *w = (rmoe_bf16_t *)buf[2], *dw = (rmoe_bf16_t *)buf[4], *work = (rmoe_bf16_t *)buf[5];
	rmoe_bf16_t *gate = work, *act = work + 2 * M * F, *u = work + 3 * M * F;
	const int64_t HF = H * F;
	const struct rmoe_xop wgu = {w, 0, HF, NE * HF, F}, wd = {w + 2 * NE * HF, 0, HF, 0, H};
	const struct rmoe_xop dwgu = {dw, 0, HF, NE * HF, F}, dwd = {dw + 2 * NE * HF, 0, HF, 0, H};
	const struct rmoe_xop wu = {w + NE * HF, 0, HF, 0, F};
	const struct rmoe_xgemm part[8] = {
		{0, 0, 'm', 0, F, H, 2, 1.0f, 0.0f, {x, H, 0, 0, H}, wgu, {gate, F, 0, M * F, F}},
		{0, 0, 'm', 0, H, F, 1, 1.0f, 0.0f, {act, F, 0, 0, F}, wd, {out, H, 0, 0, H}},
		{0, 0, 'm', 0, F, H, 2, 1.0f, 0.0f, {x, H, 0, 0, H}, wgu, {gate, F, 0, M * F, F}},
		{0, 1, 'm', 0, F, H, 1, 1.0f, 0.0f, {dy, H, 0, 0, H}, wd, {u, F, 0, 0, F}},
		{1, 0, 'k', F, H, 0, 1, 1.0f, 1.0f, {act, F, 0, 0, F}, {dy, H, 0, 0, H}, dwd},
		{1, 0, 'k', H, F, 0, 2, 1.0f, 1.0f, {x, H, 0, 0, H}, {gate, F, 0, M * F, F}, dwgu},
		{0, 1, 'm', 0, H, F, 1, 1.0f, 0.0f, {gate, F, 0, 0, F}, wgu, {out, H, 0, 0, H}},
		{0, 1, 'm', 0, H, F, 1, 1.0f, 1.0f, {gate + M * F, F, 0, 0, F}, wu, {out, H, 0, 0, H}},
	};
	const double part_flops = 22.0 * (double)M * (double)H * (double)F;
	static const char *const gemm_names[3] = {"gemms_grouped", "gemms_strided", "gemms_loop"};
	static const char *const hop_names[3] = {"hop_grouped", "hop_strided", "hop_loop"};
	double best = 0.0;
	int fastest = -1;
	for (int way = 0; way < RMOE_GEMM_WAYS && !rc; way++) {
		if (way == RMOE_GEMM_GROUPED && !RMOE_HAVE_GROUPED_GEMM)
			continue;
		rmoe_cuda_gemm_select(rmoe_gemm_way_name(way));
		auto pass = [&]() {
			struct rmoe_arena a = rmoe_arena_of({NULL, 0}, t.s);
			struct rmoe_xplan p;
			int r = rmoe_xplan_start(&p, t.s, h, &a, CUDA_R_16BF, es, NE, rpe, part, 8);
			for (int i = 0; i < 8 && !r; i++)
				r = rmoe_xplan_run(&p, i);
			rmoe_xplan_end(&p);
			const int released = rmoe_arena_release(&a);
			return r ? r : released;
		};
		const double us = timed(&t, (int)repeat, pass, none, &rc);
		const int calls = way == RMOE_GEMM_LOOP ? (int)(11 * NE) : way == RMOE_GEMM_STRIDED ? 11 : 8;
		if (!rc)
			rows[nrows++] = {gemm_names[way], R, calls, us, part_flops, 0.0};
		if (!rc && (fastest < 0 || part_flops / us > best)) {
			best = part_flops / us;
			fastest = way;
		}
	}
	/* The strided way's bound: R rows per expert need no padding. */
	if (!rc) {
		auto pass = [&]() {
			int r = 0;
			for (int i = 0; i < 8 && !r; i++) {
				const struct rmoe_xgemm *g = &part[i];
				const struct rmoe_xop *op[3] = {&g->a, &g->b, &g->c};
				for (int j = 0; j < g->problems && !r; j++) {
					const void *base[3];
					long long stride[3];
					for (int q = 0; q < 3; q++) {
						base[q] = (const char *)op[q]->base + es * (size_t)(j * op[q]->problem);
						stride[q] = op[q]->row ? (long long)(R * op[q]->ld) : (long long)op[q]->expert;
					}
					const int64_t Mg = g->rows_in == 'm' ? R : g->m, Kg = g->rows_in == 'k' ? R : g->k;
					r = rmoe_cublas_ok(cublasGemmStridedBatchedEx(h, g->tb ? CUBLAS_OP_T : CUBLAS_OP_N,
					                                              g->ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)g->n, (int)Mg,
					                                              (int)Kg, &g->alpha, base[1], CUDA_R_16BF,
					                                              (int)g->b.ld, stride[1], base[0], CUDA_R_16BF,
					                                              (int)g->a.ld, stride[0], &g->beta, (void *)base[2],
					                                              CUDA_R_16BF, (int)g->c.ld, stride[2], (int)NE,
					                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
					                   "cublasGemmStridedBatchedEx");
				}
			}
			return r;
		};
		rows[nrows++] = {"gemms_strided_nopad", R, 11, timed(&t, (int)repeat, pass, none, &rc),
		                 22.0 * (double)(R * NE) * (double)H * (double)F, 0.0};
	}
	/* The memory's bandwidth as a copy sees it. */
	if (!rc) {
		const size_t bytes = (size_t)(M * H) * es;
		auto pass = [&]() {
			return rmoe_cuda_ok(cudaMemcpyAsync(out, x, bytes, cudaMemcpyDeviceToDevice, t.s), "copy");
		};
		rows[nrows++] = {"hbm_copy", M, 0, timed(&t, (int)repeat, pass, none, &rc), 0.0, 2.0 * (double)bytes};
	}
	/* One hop's expert tasks, each way: x is consumed by the backward (its
	 * rows become the rows' dx), so it is filled again before each pass. */
	for (int way = 0; way < RMOE_GEMM_WAYS && !rc; way++) {
		if (way == RMOE_GEMM_GROUPED && !RMOE_HAVE_GROUPED_GEMM)
			continue;
		rmoe_cuda_gemm_select(rmoe_gemm_way_name(way));
		const size_t sc_bytes = rmoe_cuda_expert_bwd_scratch(1, M * K, NE);
		void *sc = NULL;
		rc = rmoe_cuda_ok(cudaMalloc(&sc, sc_bytes), "cudaMalloc");
		auto refill = [&]() {
			RMOE_LAUNCH(fill_k, rmoe_cuda_blocks(M * H), RMOE_CUDA_THREADS, 0, t.s, M * H, (uint64_t)1000, 0.05f, x);
			return rmoe_cuda_check("fill");
		};
		auto pass = [&]() {
			struct rmoe_cuda_scratch s = {sc, sc_bytes};
			int r = rmoe_cuda_expert_ffn(t.s, h, 1, H, F, NE, rpe, M, x, w, work, out);
			if (!r)
				r = rmoe_cuda_expert_ffn(t.s, h, 1, H, F, NE, rpe, M, x, w, work, NULL);
			if (!r)
				r = rmoe_cuda_expert_bwd_pairs(t.s, h, 1, H, F, NE, rpe, M, M * K, 0, K, 1, x, dy, w, order, topk_w,
				                               work, out, dg, dw, 1, s);
			return r;
		};
		const double us = rc ? 0.0 : timed(&t, (int)repeat, pass, refill, &rc);
		cudaFree(sc);
		if (!rc)
			rows[nrows++] = {hop_names[way], R, 0, us, part_flops, 0.0};
	}
	unsetenv("RMOE_CUDA_GEMM");
	if (rc) {
		fprintf(stderr, "rmoe_gemm_rate: a CUDA or cuBLAS call failed\n");
		return 1;
	}
	printf("device: %s\n", prop.name);
	for (int i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];
		if (r->bytes > 0.0)
			printf("%-20s %10.1f us %6.0f GB/s\n", r->name, r->us, r->bytes / r->us * 1e-3);
		else
			printf("%-20s %10.1f us %6.0f TFLOP/s\n", r->name, r->us, r->flops / r->us * 1e-6);
	}
	printf("partition: %lld experts, %lld rows (%lld to %lld per expert), H=%lld F=%lld\n", (long long)NE,
	       (long long)M, (long long)rpe[0], (long long)rpe[NE - 1], (long long)H, (long long)F);
	printf("fastest: %s\n", rmoe_gemm_way_name(fastest));
	if (csv) {
		FILE *f = fopen(csv, "w");
		if (!f) {
			fprintf(stderr, "rmoe_gemm_rate: cannot write %s: %s\n", csv, strerror(errno));
			return 1;
		}
		fprintf(f, "case,device,m,n,k,gemms,us,tflops,experts,fastest,gbps\n");
		for (int i = 0; i < nrows; i++) {
			const struct row *r = &rows[i];
			const int partition = strncmp(r->name, "gemms_", 6) == 0 || strncmp(r->name, "hop_", 4) == 0;
			fprintf(f, "%s,%s,%lld,%lld,%lld,%d,%.2f,%.1f,%lld,%s,", r->name, prop.name, (long long)r->m,
			        (long long)(i == 0 ? N : H), (long long)(i == 0 ? N : F), r->gemms, r->us,
			        r->flops / r->us * 1e-6, (long long)(partition ? NE : 1), rmoe_gemm_way_name(fastest));
			if (r->bytes > 0.0)
				fprintf(f, "%.1f", r->bytes / r->us * 1e-3);
			fprintf(f, "\n");
		}
		fclose(f);
	}
	for (int i = 0; i < 6; i++)
		cudaFree(buf[i]);
	cudaFree(order);
	cudaFree(topk_w);
	cudaFree(dg);
	free(rpe);
	cublasDestroy(h);
	cudaEventDestroy(t.e0);
	cudaEventDestroy(t.e1);
	cudaStreamDestroy(t.s);
	return 0;
}
