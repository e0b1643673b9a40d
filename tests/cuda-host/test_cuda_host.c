/* cuda-host: the CUDA launchers of codelets/kernels/ (cuda_rows.cu,
 * cuda_expert.cu, their row-major GEMM mapping rmoe_gemm_rm and the
 * expert GEMM ways of cuda_gemm.cuh) compiled for the host against shim/
 * (blocks of cooperative fibers; cublasGemmEx, cublasGemmStridedBatchedEx
 * and cublasGemmGroupedBatchedEx as column-major CBLAS GEMMs with cuBLAS's
 * argument checks), checked against the CPU kernels (the .c files of
 * codelets/kernels/) on seeded inputs: every launcher in fp32 and bf16,
 * each call shape it makes (the modes of the expert backward,
 * accumulation, an expert without rows, every GEMM way, the router over
 * several row blocks, rows taken 16 bytes at a time and one element at a
 * time), the device scratch each asks StarPU for, and the error codes of a
 * failed launch, GEMM or allocation. Blocks run in shuffled orders too:
 * the scatter-add and the expert backward's dx additions, which use no
 * atomics, must not change by a bit.
 *
 * Tolerances (relative norm): fp32 1e-5, a few fp32 roundings over sums of
 * at most a few hundred terms (the router's fp32 outputs 1e-6, TOL_ROUTER);
 * bf16 1e-2, the project's bound for bf16,
 * since the CUDA path stores its intermediates (pre-activations, act, u) in
 * bf16 where the CPU codelets keep fp32 copies until their outputs are
 * rounded (4e-3 at most here). Copies and
 * one-operation kernels are compared bit for bit. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rmoe_cuda_host.h"
#include "rmoe_kernels.h"
#include "rmoe_kernels_cuda.h"

#define TOL_F32 1e-5
#define TOL_BF16 1e-2
/* The router's fp32 outputs (probs, topk_w, dw_router) in both types:
 * fp32 GEMMs, or with bf16 activations bf16 ones over a three-way split of
 * the fp32 operands, exact to 2^-24 (3e-7 at most here; a two-way split
 * gives 2e-6). */
#define TOL_ROUTER 1e-6

/* The layer's shape: E = 4 experts, K = 3 of them per token, so a slice
 * holds up to three pairs of a token. */
#define NT 20
#define NH 40
#define NF 16
#define NE 4
#define NK 3
#define NP (NT * NK)

/* ---- seeded inputs, typed buffers ---------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static double rng_unit(void)
{
	return (double)(rng_next() >> 11) / 9007199254740992.0;
}

static void *xmalloc(size_t bytes)
{
	void *p = malloc(bytes > 0 ? bytes : 1);
	assert_non_null(p);
	return p;
}

/* n values uniform in +-[0.1, 1) * scale. */
static void fill(float *f, int64_t n, double scale)
{
	for (int64_t i = 0; i < n; i++)
		f[i] = (float)((rng_unit() < 0.5 ? -1 : 1) * (0.1 + 0.9 * rng_unit()) * scale);
}

/* n values as the CPU kernels see them (f: fp32, the bf16 values when
 * bf16) and as a launcher's buffer holds them (d: float32 or bf16 bits). */
struct tbuf {
	int64_t n;
	int bf16;
	float *f;
	void *d;
};

static size_t elsize(int bf16)
{
	return bf16 ? 2 : 4;
}

/* d from f, f rounded as d holds it. */
static void tb_sync(struct tbuf *b)
{
	if (b->bf16) {
		rmoe_kernel_to_bf16(b->n, b->f, b->d);
		rmoe_kernel_from_bf16(b->n, b->d, b->f);
	} else {
		memcpy(b->d, b->f, (size_t)b->n * sizeof(float));
	}
}

static struct tbuf tb_new(int64_t n, int bf16, double scale)
{
	struct tbuf b = {n, bf16, xmalloc((size_t)n * sizeof(float)), xmalloc((size_t)n * elsize(bf16))};
	fill(b.f, n, scale);
	tb_sync(&b);
	return b;
}

static struct tbuf tb_copy(const struct tbuf *a)
{
	struct tbuf b = {a->n, a->bf16, xmalloc((size_t)a->n * sizeof(float)), xmalloc((size_t)a->n * elsize(a->bf16))};
	memcpy(b.f, a->f, (size_t)a->n * sizeof(float));
	memcpy(b.d, a->d, (size_t)a->n * elsize(a->bf16));
	return b;
}

/* An output a kernel must write: NaN bits everywhere. */
static void tb_poison(struct tbuf *b)
{
	memset(b->d, 0xff, (size_t)b->n * elsize(b->bf16));
}

/* d as fp32 values. */
static float *tb_read(const struct tbuf *b)
{
	float *f = xmalloc((size_t)b->n * sizeof(float));
	if (b->bf16)
		rmoe_kernel_from_bf16(b->n, b->d, f);
	else
		memcpy(f, b->d, (size_t)b->n * sizeof(float));
	return f;
}

/* The CPU codelet's write-back of an output it computed in fp32: rounded
 * to the buffer's type. */
static void tb_round(struct tbuf *b)
{
	if (b->bf16) {
		uint16_t *t = xmalloc((size_t)b->n * 2);
		rmoe_kernel_to_bf16(b->n, b->f, t);
		rmoe_kernel_from_bf16(b->n, t, b->f);
		free(t);
	}
}

static void tb_free(struct tbuf *b)
{
	free(b->f);
	free(b->d);
	b->f = b->d = NULL;
}

/* ---- comparisons ---------------------------------------------------------------------- */

static double rel_err(const float *a, const float *ref, int64_t n)
{
	double num = 0.0, den = 0.0;
	for (int64_t i = 0; i < n; i++) {
		const double d = (double)a[i] - (double)ref[i];
		num += d * d;
		den += (double)ref[i] * ref[i];
	}
	return sqrt(num / (den > 0.0 ? den : 1e-300));
}

static char variant[160];

static void set_variant(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_variant(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(variant, sizeof(variant), fmt, ap);
	va_end(ap);
}

/* The launcher's output d against the CPU kernel's f, within tol. */
static void expect_close(const struct tbuf *got, const float *ref, int64_t n, double tol, const char *what)
{
	float *g = tb_read(got);
	const double err = rel_err(g, ref, n);
	free(g);
	if (!(err <= tol))
		fail_msg("%s (%s): relative error %.3g, above %.3g", what, variant, err, tol);
}

static void expect_same_bits(const void *a, const void *b, size_t bytes, const char *what)
{
	if (memcmp(a, b, bytes)) {
		size_t at = 0;
		while (((const unsigned char *)a)[at] == ((const unsigned char *)b)[at])
			at++;
		fail_msg("%s (%s): bytes differ from byte %zu of %zu", what, variant, at, bytes);
	}
}

static void expect_rc(int rc, const char *what)
{
	if (rc)
		fail_msg("%s (%s): launcher returned %d", what, variant, rc);
}

/* ---- routing ---------------------------------------------------------------------- */

struct routing {
	int32_t idx[NP], order[NP], counts[NE];
	float w[NP];
};

/* K distinct experts per token, in a random order, and the CPU dispatch
 * map. */
static void route(struct routing *r)
{
	for (int t = 0; t < NT; t++) {
		int32_t e[NE];
		for (int i = 0; i < NE; i++)
			e[i] = i;
		for (int i = NE - 1; i > 0; i--) {
			int j = (int)(rng_next() % (uint64_t)(i + 1)), x = e[i];
			e[i] = e[j];
			e[j] = x;
		}
		memcpy(r->idx + t * NK, e, NK * sizeof(int32_t));
	}
	fill(r->w, NP, 1.0);
	assert_int_equal(rmoe_kernel_dispatch_map(NP, NE, r->idx, r->order, r->counts), -1);
}

static cublasHandle_t blas;

static int group_setup(void **state)
{
	(void)state;
	return cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS ? 0 : -1;
}

static int group_teardown(void **state)
{
	(void)state;
	rmoe_cuda_host_release();
	return cublasDestroy(blas) == CUBLAS_STATUS_SUCCESS ? 0 : -1;
}

static int setup(void **state)
{
	(void)state;
	rng_state = 0x9e3779b97f4a7c15ull;
	rmoe_cuda_host_schedule(0);
	rmoe_cuda_host_reset_counts();
	return 0;
}

/* A scratch of bytes (host memory: the shim's device memory). */
static struct rmoe_cuda_scratch scratch_of(size_t bytes)
{
	struct rmoe_cuda_scratch s = {bytes ? xmalloc(bytes) : NULL, bytes};
	return s;
}

/* The launcher took all its scratch from the one StarPU would declare. */
static void expect_no_malloc(const char *what)
{
	struct rmoe_cuda_host_counts c;
	rmoe_cuda_host_counts(&c);
	if (c.mallocs)
		fail_msg("%s (%s): %ld cudaMallocAsync calls (%zu bytes) beyond its declared scratch", what, variant,
		         c.mallocs, c.malloc_bytes);
}

/* ---- router --------------------------------------------------------------------------- */

/* T = 1100 runs the backward over several row blocks (the test build's
 * RMOE_ROUTER_ROWS and RMOE_ROUTER_SPLIT_ROWS, tests/cuda-host/CMakeLists.txt). */
static void test_cuda_host_router_fwd(void **state)
{
	(void)state;
	const int64_t Ts[] = {37, 1100}, H = 24, E = 10, K = 3;
	for (int ti = 0; ti < 2; ti++)
		for (int bf16 = 0; bf16 < 2; bf16++)
			for (int norm = 0; norm < 2; norm++) {
				const int64_t T = Ts[ti];
				set_variant("T=%lld bf16=%d norm=%d", (long long)T, bf16, norm);
				struct tbuf x = tb_new(T * H, bf16, 1.0), probs = tb_new(T * E, 0, 1.0), tw = tb_new(T * K, 0, 1.0);
				float *w = xmalloc((size_t)(H * E) * sizeof(float)), *probs_c = xmalloc((size_t)(T * E) * sizeof(float));
				float *tw_c = xmalloc((size_t)(T * K) * sizeof(float));
				int32_t *idx = xmalloc((size_t)(T * K) * sizeof(int32_t)), *idx_c = xmalloc((size_t)(T * K) * sizeof(int32_t));
				fill(w, H * E, 0.5);
				rmoe_kernel_router_fwd(T, H, E, K, norm, x.f, w, probs_c, idx_c, tw_c);
				tb_poison(&probs);
				tb_poison(&tw);
				struct rmoe_cuda_scratch sc = scratch_of(rmoe_cuda_router_fwd_scratch(bf16, T, H, E));
				rmoe_cuda_host_reset_counts();
				expect_rc(rmoe_cuda_router_fwd(NULL, blas, bf16, T, H, E, K, norm, x.d, w, probs.d, idx, tw.d, sc),
				          "router-fwd");
				expect_no_malloc("router-fwd");
				expect_close(&probs, probs_c, T * E, TOL_ROUTER, "probs");
				expect_close(&tw, tw_c, T * K, TOL_ROUTER, "topk_w");
				expect_same_bits(idx, idx_c, (size_t)(T * K) * sizeof(int32_t), "topk_idx");
				free(sc.p);
				free(w);
				free(probs_c);
				free(tw_c);
				free(idx);
				free(idx_c);
				tb_free(&x);
				tb_free(&probs);
				tb_free(&tw);
			}
}

static void test_cuda_host_router_bwd(void **state)
{
	(void)state;
	const int64_t Ts[] = {37, 1100}, H = 24, E = 10, K = 3;
	for (int ti = 0; ti < 2; ti++)
		for (int bf16 = 0; bf16 < 2; bf16++)
			for (int variant_i = 0; variant_i < 2; variant_i++) {
				const int64_t T = Ts[ti];
				const int norm = variant_i, with_dprobs = !variant_i;
				set_variant("T=%lld bf16=%d norm=%d dprobs=%d", (long long)T, bf16, norm, with_dprobs);
				struct tbuf x = tb_new(T * H, bf16, 1.0), dx = tb_new(T * H, bf16, 1.0), dw = tb_new(H * E, 0, 1.0);
				float *w = xmalloc((size_t)(H * E) * sizeof(float)), *probs = xmalloc((size_t)(T * E) * sizeof(float));
				float *tw = xmalloc((size_t)(T * K) * sizeof(float)), *dg = xmalloc((size_t)(T * K) * sizeof(float));
				float *dprobs = xmalloc((size_t)(T * E) * sizeof(float));
				int32_t *idx = xmalloc((size_t)(T * K) * sizeof(int32_t));
				fill(w, H * E, 0.5);
				fill(dg, T * K, 1.0);
				fill(dprobs, T * E, 0.1);
				rmoe_kernel_router_fwd(T, H, E, K, norm, x.f, w, probs, idx, tw);
				tb_poison(&dw);
				assert_int_equal(rmoe_kernel_router_bwd(T, H, E, K, norm, x.f, w, probs, idx, tw, dg,
				                                        with_dprobs ? dprobs : NULL, dx.f, dw.f),
				                 0);
				tb_round(&dx);
				struct rmoe_cuda_scratch sc = scratch_of(rmoe_cuda_router_bwd_scratch(bf16, T, H, E));
				rmoe_cuda_host_reset_counts();
				expect_rc(rmoe_cuda_router_bwd(NULL, blas, bf16, T, H, E, K, norm, x.d, w, probs, idx, tw, dg,
				                               with_dprobs ? dprobs : NULL, dx.d, dw.d, sc),
				          "router-bwd");
				expect_no_malloc("router-bwd");
				expect_close(&dw, dw.f, H * E, TOL_ROUTER, "dw_router");
				expect_close(&dx, dx.f, T * H, bf16 ? TOL_BF16 : TOL_F32, "dx");
				free(sc.p);
				free(w);
				free(probs);
				free(tw);
				free(dg);
				free(dprobs);
				free(idx);
				tb_free(&x);
				tb_free(&dx);
				tb_free(&dw);
			}
}

/* ---- dispatch map ----------------------------------------------------------------------- */

/* With the scratch StarPU would declare, with none and with too little
 * (the launcher then allocates the rest); E = 300 sorts on 9 bits. */
static void test_cuda_host_dispatch_map(void **state)
{
	(void)state;
	const int64_t Es[] = {NE, 300};
	for (int ei = 0; ei < 2; ei++)
		for (int given = 0; given < 3; given++) {
			const int64_t E = Es[ei], T = 50, K = 3, P = T * K;
			set_variant("E=%lld scratch=%s", (long long)E, given == 0 ? "declared" : given == 1 ? "none" : "short");
			int32_t *idx = xmalloc((size_t)P * sizeof(int32_t)), *order = xmalloc((size_t)P * sizeof(int32_t));
			int32_t *order_c = xmalloc((size_t)P * sizeof(int32_t)), *counts = xmalloc((size_t)E * sizeof(int32_t));
			int32_t *counts_c = xmalloc((size_t)E * sizeof(int32_t));
			for (int64_t p = 0; p < P; p++)
				idx[p] = (int32_t)(rng_next() % (uint64_t)E);
			assert_int_equal(rmoe_kernel_dispatch_map(P, E, idx, order_c, counts_c), -1);
			const size_t want = rmoe_cuda_dispatch_map_scratch(P, E);
			struct rmoe_cuda_scratch sc = scratch_of(given == 0 ? want : given == 1 ? 0 : want / 3);
			memset(order, 0xff, (size_t)P * sizeof(int32_t));
			rmoe_cuda_host_reset_counts();
			expect_rc(rmoe_cuda_dispatch_map(NULL, P, E, idx, order, counts, sc), "dispatch-map");
			if (given == 0)
				expect_no_malloc("dispatch-map");
			expect_same_bits(order, order_c, (size_t)P * sizeof(int32_t), "pair_order");
			expect_same_bits(counts, counts_c, (size_t)E * sizeof(int32_t), "counts");
			free(sc.p);
			free(idx);
			free(order);
			free(order_c);
			free(counts);
			free(counts_c);
		}
}

/* ---- rows of a slice ------------------------------------------------------------------------ */

/* The slices: experts {0, 1}, experts {2, 3} (a partition each, up to two
 * pairs of a token), and all pairs (three). */
static void slices(const struct routing *r, int64_t first[3], int64_t count[3])
{
	first[0] = 0;
	count[0] = r->counts[0] + r->counts[1];
	first[1] = count[0];
	count[1] = r->counts[2] + r->counts[3];
	first[2] = 0;
	count[2] = NP;
}

/* H = 40: 16-byte accesses in both types; H = 37: one element at a
 * time. */
static void test_cuda_host_gather(void **state)
{
	(void)state;
	struct routing r;
	route(&r);
	int64_t first[3], count[3];
	slices(&r, first, count);
	const int64_t Hs[] = {NH, 37};
	for (int hi = 0; hi < 2; hi++)
		for (int bf16 = 0; bf16 < 2; bf16++)
			for (int weighted = 0; weighted < 2; weighted++)
				for (int s = 0; s < 3; s++) {
					const int64_t H = Hs[hi];
					set_variant("H=%lld bf16=%d weighted=%d slice=%d", (long long)H, bf16, weighted, s);
					struct tbuf src = tb_new(NT * H, bf16, 1.0), rows = tb_new(count[s] * H, bf16, 1.0);
					rmoe_kernel_gather(H, NK, first[s], count[s], src.f, r.order, weighted ? r.w : NULL, rows.f);
					tb_round(&rows);
					struct tbuf want = tb_copy(&rows);
					tb_sync(&want);
					tb_poison(&rows);
					expect_rc(rmoe_cuda_gather(NULL, bf16, H, NK, first[s], count[s], src.d, r.order,
					                           weighted ? r.w : NULL, rows.d),
					          "gather");
					expect_same_bits(rows.d, want.d, (size_t)rows.n * elsize(bf16), "rows");
					tb_free(&src);
					tb_free(&rows);
					tb_free(&want);
				}
}

/* The launcher's scatter-add of rows of H into a copy of dst, under
 * schedule seed. */
static struct tbuf scatter(const struct routing *r, int64_t H, int bf16, int64_t first, int64_t count,
                           const struct tbuf *rows, int weighted, const struct tbuf *dst, int deterministic,
                           unsigned seed)
{
	struct tbuf out = tb_copy(dst);
	struct rmoe_cuda_scratch sc = scratch_of(rmoe_cuda_rows_add_scratch(deterministic, NP));
	rmoe_cuda_host_schedule(seed);
	rmoe_cuda_host_reset_counts();
	expect_rc(rmoe_cuda_scatter_add(NULL, bf16, H, NK, NP, first, count, rows->d, r->order, weighted ? r->w : NULL,
	                                out.d, deterministic, sc),
	          "scatter-add");
	expect_no_malloc("scatter-add");
	rmoe_cuda_host_schedule(0);
	free(sc.p);
	return out;
}

/* The scatter-add has no atomics left, with --deterministic or without:
 * every run is bit for bit the CPU kernel's sums (the same order, the same
 * roundings), and so the same as every other run, whatever order the
 * blocks and their threads run in. H = 40 takes 16-byte accesses in both
 * types, H = 37 one element at a time. */
static void test_cuda_host_scatter_add(void **state)
{
	(void)state;
	struct routing r;
	route(&r);
	int64_t first[3], count[3];
	slices(&r, first, count);
	const int64_t Hs[] = {NH, 37};
	for (int hi = 0; hi < 2; hi++)
		for (int bf16 = 0; bf16 < 2; bf16++)
			for (int weighted = 0; weighted < 2; weighted++)
				for (int s = 0; s < 3; s++) {
					const int64_t H = Hs[hi];
					struct tbuf rows = tb_new(count[s] * H, bf16, 1.0), dst = tb_new(NT * H, bf16, 1.0);
					struct tbuf want = tb_copy(&dst);
					rmoe_kernel_scatter_add(H, NK, first[s], count[s], rows.f, r.order, weighted ? r.w : NULL, want.f);
					tb_sync(&want);
					struct tbuf run0 = {0, 0, NULL, NULL};
					for (int det = 0; det < 2; det++)
						for (unsigned seed = 0; seed < 4; seed++) {
							set_variant("H=%lld bf16=%d weighted=%d slice=%d deterministic=%d seed=%u", (long long)H,
							            bf16, weighted, s, det, seed);
							struct tbuf got =
								scatter(&r, H, bf16, first[s], count[s], &rows, weighted, &dst, det, seed);
							expect_same_bits(got.d, want.d, (size_t)got.n * elsize(bf16), "dst against the CPU kernel");
							if (run0.d)
								expect_same_bits(got.d, run0.d, (size_t)got.n * elsize(bf16), "dst against run 0");
							if (run0.d)
								tb_free(&got);
							else
								run0 = got;
						}
					tb_free(&run0);
					tb_free(&rows);
					tb_free(&dst);
					tb_free(&want);
				}
}

static void test_cuda_host_unpermute_bwd(void **state)
{
	(void)state;
	struct routing r;
	route(&r);
	int64_t first[3], count[3];
	slices(&r, first, count);
	/* H = 300: more columns than a block's threads. */
	const int64_t Hs[] = {NH, 300};
	for (int hi = 0; hi < 2; hi++)
		for (int bf16 = 0; bf16 < 2; bf16++)
			for (int s = 0; s < 3; s++) {
				const int64_t H = Hs[hi];
				set_variant("H=%lld bf16=%d slice=%d", (long long)H, bf16, s);
				struct tbuf dy = tb_new(NT * H, bf16, 1.0), back = tb_new(count[s] * H, bf16, 1.0);
				struct tbuf dout = tb_new(count[s] * H, bf16, 1.0);
				float *dg = xmalloc(NP * sizeof(float)), *dg_c = xmalloc(NP * sizeof(float));
				fill(dg_c, NP, 1.0);
				memcpy(dg, dg_c, NP * sizeof(float));
				rmoe_kernel_unpermute_bwd(H, NK, first[s], count[s], dy.f, back.f, r.order, r.w, dout.f, dg_c);
				struct tbuf want = tb_copy(&dout);
				tb_sync(&want);
				tb_poison(&dout);
				expect_rc(rmoe_cuda_unpermute_bwd(NULL, bf16, H, NK, first[s], count[s], dy.d, back.d, r.order, r.w,
				                                  dout.d, dg),
				          "unpermute-bwd");
				expect_same_bits(dout.d, want.d, (size_t)dout.n * elsize(bf16), "dout");
				const double err = rel_err(dg, dg_c, NP);
				if (!(err <= TOL_F32))
					fail_msg("dg (%s): relative error %.3g", variant, err);
				free(dg);
				free(dg_c);
				tb_free(&dy);
				tb_free(&back);
				tb_free(&dout);
				tb_free(&want);
			}
}

/* ---- the shared expert's gate ------------------------------------------------------------ */

/* The CUDA gate kernels against the CPU ones: the scaled output, the gated
 * dy, dx and dw, fp32 and bf16, H below and above a block's threads. */
static void test_cuda_host_shared_gate(void **state)
{
	(void)state;
	const int64_t Hs[] = {NH, 300};
	for (int hi = 0; hi < 2; hi++)
		for (int bf16 = 0; bf16 < 2; bf16++) {
			const int64_t H = Hs[hi];
			const double tol = bf16 ? TOL_BF16 : TOL_F32;
			set_variant("H=%lld bf16=%d", (long long)H, bf16);
			struct tbuf x = tb_new(NT * H, bf16, 1.0), dy = tb_new(NT * H, bf16, 1.0);
			struct tbuf out = tb_new(NT * H, bf16, 1.0), dx = tb_new(NT * H, bf16, 1.0);
			float *w = xmalloc((size_t)H * sizeof(float)), *dw = xmalloc((size_t)H * sizeof(float));
			float *dw_c = xmalloc((size_t)H * sizeof(float)), *dz = xmalloc(NT * sizeof(float));
			fill(w, H, 0.2);
			struct tbuf fwd = tb_copy(&out);
			rmoe_kernel_shared_gate_fwd(NT, H, x.f, w, fwd.f);
			tb_round(&fwd);
			expect_rc(rmoe_cuda_shared_gate_fwd(NULL, bf16, NT, H, x.d, w, fwd.d), "shared-gate-fwd");
			expect_close(&fwd, fwd.f, NT * H, tol, "gated output");
			struct tbuf bwd = tb_copy(&out), dxg = tb_copy(&dx);
			rmoe_kernel_shared_gate_bwd(NT, H, x.f, w, dy.f, bwd.f, dxg.f, dw_c, dz);
			tb_round(&bwd);
			tb_round(&dxg);
			fill(dw, H, 1.0);
			struct rmoe_cuda_scratch sc = scratch_of(rmoe_cuda_shared_gate_bwd_scratch(NT));
			expect_rc(rmoe_cuda_shared_gate_bwd(NULL, bf16, NT, H, x.d, w, dy.d, bwd.d, dxg.d, dw, sc),
			          "shared-gate-bwd");
			free(sc.p);
			expect_close(&bwd, bwd.f, NT * H, tol, "gated dy");
			expect_close(&dxg, dxg.f, NT * H, tol, "dx");
			const double err = rel_err(dw, dw_c, H);
			if (!(err <= TOL_F32))
				fail_msg("dw (%s): relative error %.3g", variant, err);
			free(w);
			free(dw);
			free(dw_c);
			free(dz);
			tb_free(&x);
			tb_free(&dy);
			tb_free(&out);
			tb_free(&dx);
			tb_free(&fwd);
			tb_free(&bwd);
			tb_free(&dxg);
		}
}

/* ---- experts ---------------------------------------------------------------------------- */

/* Three experts, the second without rows; the slice [7, 37) of the pair
 * order, where tokens have two or three pairs. Each case runs every GEMM
 * way (RMOE_CUDA_GEMM, cuda_gemm.cuh) at F = 16 (16-byte accesses in both
 * types) and F = 12 (bf16 rows then one element at a time). */
#define XNE 3
#define XM 30
#define XFIRST 7
static const int64_t xrpe[XNE] = {12, 0, 18};
#define XW(F) (3 * XNE * NH * (F))
static const char *const ways[] = {"grouped", "strided", "loop"};
#define NWAYS 3
static const int64_t xfs[] = {16, 12};
#define NXF 2

static void set_way(int way)
{
	assert_int_equal(rmoe_cuda_gemm_select(ways[way]), 0);
}

static int way_teardown(void **state)
{
	(void)state;
	return rmoe_cuda_gemm_select(NULL);
}

/* A launcher without a scratch argument (expert-ffn, preweighted): the
 * grouped way allocates its pointer arrays, at most bytes, in one
 * cudaMallocAsync; the loop way nothing; the strided way its padded rows. */
static void expect_arrays_only(int way, size_t bytes, const char *what)
{
	struct rmoe_cuda_host_counts c;
	rmoe_cuda_host_counts(&c);
	if (way == 0 && !(c.mallocs == 1 && c.malloc_bytes <= bytes))
		fail_msg("%s (%s): %ld cudaMallocAsync calls (%zu bytes), not the pointer arrays' one of <= %zu", what,
		         variant, c.mallocs, c.malloc_bytes, bytes);
	if (way == 2 && c.mallocs)
		fail_msg("%s (%s): %ld cudaMallocAsync calls in the loop way", what, variant, c.mallocs);
}

static void test_cuda_host_expert_ffn(void **state)
{
	(void)state;
	for (int way = 0; way < NWAYS; way++)
		for (int fi = 0; fi < NXF; fi++)
			for (int bf16 = 0; bf16 < 2; bf16++)
				for (int recompute = 0; recompute < 2; recompute++) {
					const int64_t F = xfs[fi];
					set_way(way);
					set_variant("way=%s F=%lld bf16=%d %s", ways[way], (long long)F, bf16,
					            recompute ? "recompute (no out, 4F work)" : "forward");
					const int64_t nwork = (recompute ? 4 : 3) * XM * F;
					struct tbuf x = tb_new(XM * NH, bf16, 1.0), w = tb_new(XW(F), bf16, 0.3);
					struct tbuf work = tb_new(nwork, bf16, 1.0), out = tb_new(XM * NH, bf16, 1.0);
					rmoe_kernel_expert_ffn(NH, F, XNE, xrpe, XM, x.f, w.f, work.f, recompute ? NULL : out.f);
					tb_round(&work);
					tb_round(&out);
					tb_poison(&work);
					tb_poison(&out);
					rmoe_cuda_host_reset_counts();
					expect_rc(rmoe_cuda_expert_ffn(NULL, blas, bf16, NH, F, XNE, xrpe, XM, x.d, w.d, work.d,
					                               recompute ? NULL : out.d),
					          "expert-ffn");
					expect_arrays_only(way, rmoe_cuda_expert_ffn_scratch(XNE), "expert-ffn");
					/* The three blocks the forward writes. */
					expect_close(&work, work.f, 3 * XM * F, bf16 ? TOL_BF16 : TOL_F32, "work");
					if (!recompute)
						expect_close(&out, out.f, XM * NH, bf16 ? TOL_BF16 : TOL_F32, "out");
					tb_free(&x);
					tb_free(&w);
					tb_free(&work);
					tb_free(&out);
				}
}

/* The inputs of the pair-weighted backward: the recompute's work. */
struct bwd_case {
	int64_t F;
	struct routing r;
	struct tbuf x, dy, w, work, dx, dw;
	float dg[NP];
};

static void bwd_case_new(struct bwd_case *c, int64_t F, int bf16, int accumulate)
{
	c->F = F;
	route(&c->r);
	c->x = tb_new(XM * NH, bf16, 1.0);
	c->dy = tb_new(XM * NH, bf16, 1.0);
	c->w = tb_new(XW(F), bf16, 0.3);
	c->work = tb_new(4 * XM * F, bf16, 1.0);
	rmoe_kernel_expert_ffn(NH, F, XNE, xrpe, XM, c->x.f, c->w.f, c->work.f, NULL);
	tb_sync(&c->work);
	c->dx = tb_new(NT * NH, bf16, 1.0);
	c->dw = tb_new(XW(F), bf16, 1.0);
	if (!accumulate)
		tb_poison(&c->dw);
	fill(c->dg, NP, 1.0);
}

static void bwd_case_free(struct bwd_case *c)
{
	tb_free(&c->x);
	tb_free(&c->dy);
	tb_free(&c->w);
	tb_free(&c->work);
	tb_free(&c->dx);
	tb_free(&c->dw);
}

/* The launcher on copies of c's buffers, under schedule seed, with the
 * scratch a codelet would declare (rmoe_cuda_expert_bwd_scratch: the dx
 * index and the grouped way's pointer arrays); x, dx, dg, dw come back. */
static void bwd_pairs_run(const struct bwd_case *c, int bf16, int with_dx, int accumulate, int deterministic,
                          unsigned seed, struct tbuf *x, struct tbuf *dx, float *dg, struct tbuf *dw)
{
	struct tbuf work = tb_copy(&c->work);
	*x = tb_copy(&c->x);
	*dx = tb_copy(&c->dx);
	*dw = tb_copy(&c->dw);
	memcpy(dg, c->dg, sizeof(c->dg));
	struct rmoe_cuda_scratch sc = scratch_of(rmoe_cuda_expert_bwd_scratch(deterministic, with_dx ? NP : 0, XNE));
	rmoe_cuda_host_schedule(seed);
	rmoe_cuda_host_reset_counts();
	expect_rc(rmoe_cuda_expert_bwd_pairs(NULL, blas, bf16, NH, c->F, XNE, xrpe, XM, NP, XFIRST, NK, accumulate, x->d,
	                                     c->dy.d, c->w.d, c->r.order, c->r.w, work.d, with_dx ? dx->d : NULL, dg,
	                                     dw->d, deterministic, sc),
	          "expert-bwd pairs");
	if (strcmp(rmoe_cuda_gemm_name(), "strided"))
		expect_no_malloc("expert-bwd pairs");
	rmoe_cuda_host_schedule(0);
	free(sc.p);
	tb_free(&work);
}

/* RMOE_BWD_PAIR_WEIGHTED (dx added to) and RMOE_BWD_PAIR_ROWS (dx NULL:
 * the rows' dx left in x), weight gradients overwritten or added to, with
 * and without --deterministic: either way the dx additions are the CPU
 * kernel's, bit for bit, in every block order. */
static void test_cuda_host_expert_bwd_pairs(void **state)
{
	(void)state;
	for (int way = 0; way < NWAYS; way++)
		for (int fi = 0; fi < NXF; fi++)
			for (int bf16 = 0; bf16 < 2; bf16++)
				for (int with_dx = 0; with_dx < 2; with_dx++)
					for (int accumulate = 0; accumulate < 2; accumulate++)
						for (int det = 0; det < 2; det++) {
							const int64_t F = xfs[fi];
							set_way(way);
							set_variant("way=%s F=%lld bf16=%d mode=%s accumulate=%d deterministic=%d", ways[way],
							            (long long)F, bf16, with_dx ? "pair-weighted" : "pair-rows", accumulate, det);
							struct bwd_case c;
							bwd_case_new(&c, F, bf16, accumulate);
							struct tbuf x = tb_copy(&c.x), dx = tb_copy(&c.dx), dw = tb_copy(&c.dw),
							            work = tb_copy(&c.work);
							float dg_c[NP];
							memcpy(dg_c, c.dg, sizeof(dg_c));
							rmoe_kernel_expert_bwd_pairs(NH, F, XNE, xrpe, XM, XFIRST, NK, accumulate, x.f, c.dy.f,
							                             c.w.f, c.r.order, c.r.w, work.f, with_dx ? dx.f : NULL, dg_c,
							                             dw.f);
							tb_round(&x);
							tb_round(&dx);
							tb_round(&dw);
							struct tbuf gx, gdx, gdw;
							float dg[NP];
							bwd_pairs_run(&c, bf16, with_dx, accumulate, det, 0, &gx, &gdx, dg, &gdw);
							const double tol = bf16 ? TOL_BF16 : TOL_F32;
							expect_close(&gx, x.f, XM * NH, tol, "x rows (their dx)");
							expect_close(&gdw, dw.f, XW(F), tol, "dweights");
							if (with_dx)
								expect_close(&gdx, dx.f, NT * NH, tol, "dx");
							else
								expect_same_bits(gdx.d, c.dx.d, (size_t)gdx.n * elsize(bf16), "dx (not a target)");
							float dgs[XM], dgs_c[XM];
							for (int i = 0; i < XM; i++) {
								dgs[i] = dg[c.r.order[XFIRST + i]];
								dgs_c[i] = dg_c[c.r.order[XFIRST + i]];
							}
							const double err = rel_err(dgs, dgs_c, XM);
							if (!(err <= tol))
								fail_msg("dg (%s): relative error %.3g", variant, err);
							if (with_dx) {
								/* The launcher's own rows' dx added as the CPU
								 * kernel adds them (its saxpy in slice order):
								 * bit for bit. */
								struct tbuf order_dx = tb_copy(&c.dx);
								float *rows_dx = tb_read(&gx);
								rmoe_kernel_scatter_add(NH, NK, XFIRST, XM, rows_dx, c.r.order, NULL, order_dx.f);
								tb_sync(&order_dx);
								expect_same_bits(gdx.d, order_dx.d, (size_t)gdx.n * elsize(bf16),
								                 "dx in the CPU's order");
								free(rows_dx);
								tb_free(&order_dx);
							}
							for (unsigned seed = 1; with_dx && seed < 3; seed++) {
								struct tbuf sx, sdx, sdw;
								float sdg[NP];
								bwd_pairs_run(&c, bf16, with_dx, accumulate, det, seed, &sx, &sdx, sdg, &sdw);
								expect_same_bits(sdx.d, gdx.d, (size_t)sdx.n * elsize(bf16),
								                 "dx in another block order");
								tb_free(&sx);
								tb_free(&sdx);
								tb_free(&sdw);
							}
							tb_free(&gx);
							tb_free(&gdx);
							tb_free(&gdw);
							tb_free(&x);
							tb_free(&dx);
							tb_free(&dw);
							tb_free(&work);
							bwd_case_free(&c);
						}
}

static void test_cuda_host_expert_bwd_preweighted(void **state)
{
	(void)state;
	for (int way = 0; way < NWAYS; way++)
		for (int fi = 0; fi < NXF; fi++)
			for (int bf16 = 0; bf16 < 2; bf16++)
				for (int accumulate = 0; accumulate < 2; accumulate++) {
					const int64_t F = xfs[fi];
					set_way(way);
					set_variant("way=%s F=%lld bf16=%d accumulate=%d", ways[way], (long long)F, bf16, accumulate);
					struct tbuf x = tb_new(XM * NH, bf16, 1.0), dout = tb_new(XM * NH, bf16, 1.0);
					struct tbuf w = tb_new(XW(F), bf16, 0.3), work = tb_new(3 * XM * F, bf16, 1.0);
					struct tbuf dx = tb_new(XM * NH, bf16, 1.0), dw = tb_new(XW(F), bf16, 1.0);
					rmoe_kernel_expert_ffn(NH, F, XNE, xrpe, XM, x.f, w.f, work.f, NULL);
					tb_sync(&work);
					if (!accumulate)
						tb_poison(&dw);
					struct tbuf gwork = tb_copy(&work), gdw = tb_copy(&dw);
					rmoe_kernel_expert_bwd_preweighted(NH, F, XNE, xrpe, XM, accumulate, x.f, dout.f, w.f, work.f,
					                                   dx.f, dw.f);
					tb_round(&dx);
					tb_round(&dw);
					tb_poison(&dx);
					rmoe_cuda_host_reset_counts();
					expect_rc(rmoe_cuda_expert_bwd_preweighted(NULL, blas, bf16, NH, F, XNE, xrpe, XM, accumulate,
					                                           x.d, dout.d, w.d, gwork.d, dx.d, gdw.d),
					          "expert-bwd preweighted");
					expect_arrays_only(way, rmoe_cuda_expert_bwd_scratch(0, 0, XNE), "expert-bwd preweighted");
					const double tol = bf16 ? TOL_BF16 : TOL_F32;
					expect_close(&dx, dx.f, XM * NH, tol, "dx rows");
					expect_close(&gdw, dw.f, XW(F), tol, "dweights");
					tb_free(&x);
					tb_free(&dout);
					tb_free(&w);
					tb_free(&work);
					tb_free(&dx);
					tb_free(&dw);
					tb_free(&gwork);
					tb_free(&gdw);
				}
}

/* The grouped way's calls are the loop way's problems, each through its
 * own pointers: on the shim, whose GEMMs compute each problem alike, the
 * two give the same bits; the strided way, whose padded rows change the
 * sums' length, is held to the tolerances above. */
static void test_cuda_host_gemm_ways(void **state)
{
	(void)state;
	for (int fi = 0; fi < NXF; fi++)
		for (int bf16 = 0; bf16 < 2; bf16++) {
			const int64_t F = xfs[fi];
			set_variant("F=%lld bf16=%d", (long long)F, bf16);
			struct bwd_case c;
			bwd_case_new(&c, F, bf16, 0);
			struct tbuf x[2], dx[2], dw[2];
			float dg[2][NP];
			for (int way = 0; way < 2; way++) {
				set_way(way == 0 ? 0 : 2);
				bwd_pairs_run(&c, bf16, 1, 0, 0, 0, &x[way], &dx[way], dg[way], &dw[way]);
			}
			expect_same_bits(x[0].d, x[1].d, (size_t)x[0].n * elsize(bf16), "x rows, grouped against loop");
			expect_same_bits(dx[0].d, dx[1].d, (size_t)dx[0].n * elsize(bf16), "dx, grouped against loop");
			expect_same_bits(dw[0].d, dw[1].d, (size_t)dw[0].n * elsize(bf16), "dweights, grouped against loop");
			expect_same_bits(dg[0], dg[1], sizeof(dg[0]), "dg, grouped against loop");
			for (int way = 0; way < 2; way++) {
				tb_free(&x[way]);
				tb_free(&dx[way]);
				tb_free(&dw[way]);
			}
			bwd_case_free(&c);
		}
}

/* A partition of many experts (90: more pointers than one upload
 * launch carries, RMOE_UPLOAD_WORDS) of 0 to 2 rows, all 60 pairs: every
 * way against the CPU kernels, forward and pair-weighted backward. Then
 * one of no rows at all: nothing to compute, gradients zeroed unless
 * accumulated. */
#define MNE 90
static void test_cuda_host_expert_many(void **state)
{
	(void)state;
	const int64_t F = 8;
	int64_t rpe[MNE], m = 0;
	for (int e = 0; e < MNE; e++) {
		rpe[e] = m < NP ? (int64_t)(rng_next() % 3) : 0;
		rpe[e] = m + rpe[e] > NP ? NP - m : rpe[e];
		m += rpe[e];
	}
	rpe[MNE - 1] += NP - m;
	m = NP;
	const int64_t W = 3 * MNE * NH * F;
	for (int way = 0; way < NWAYS; way++)
		for (int bf16 = 0; bf16 < 2; bf16++) {
			set_way(way);
			set_variant("way=%s bf16=%d experts=%d", ways[way], bf16, MNE);
			struct routing r;
			route(&r);
			struct tbuf x = tb_new(m * NH, bf16, 1.0), dy = tb_new(m * NH, bf16, 1.0), w = tb_new(W, bf16, 0.3);
			struct tbuf work = tb_new(4 * m * F, bf16, 1.0), out = tb_new(m * NH, bf16, 1.0);
			struct tbuf dx = tb_new(NT * NH, bf16, 1.0), dw = tb_new(W, bf16, 1.0);
			float dg[NP], dg_c[NP];
			fill(dg_c, NP, 1.0);
			memcpy(dg, dg_c, sizeof(dg));
			rmoe_kernel_expert_ffn(NH, F, MNE, rpe, m, x.f, w.f, work.f, out.f);
			tb_round(&out);
			struct tbuf gout = tb_copy(&out), gwork = tb_copy(&work);
			tb_poison(&gout);
			expect_rc(rmoe_cuda_expert_ffn(NULL, blas, bf16, NH, F, MNE, rpe, m, x.d, w.d, gwork.d, gout.d),
			          "expert-ffn");
			const double tol = bf16 ? TOL_BF16 : TOL_F32;
			expect_close(&gout, out.f, m * NH, tol, "out");
			/* The backward from the recompute's work, rounded as the
			 * launcher's is. */
			tb_sync(&work);
			struct tbuf gx = tb_copy(&x), gdx = tb_copy(&dx), gdw = tb_copy(&dw);
			memcpy(gwork.d, work.d, (size_t)work.n * elsize(bf16));
			rmoe_kernel_expert_bwd_pairs(NH, F, MNE, rpe, m, 0, NK, 0, x.f, dy.f, w.f, r.order, r.w, work.f, dx.f,
			                             dg_c, dw.f);
			tb_round(&x);
			tb_round(&dx);
			tb_round(&dw);
			struct rmoe_cuda_scratch sc = scratch_of(rmoe_cuda_expert_bwd_scratch(0, NP, MNE));
			expect_rc(rmoe_cuda_expert_bwd_pairs(NULL, blas, bf16, NH, F, MNE, rpe, m, NP, 0, NK, 0, gx.d, dy.d,
			                                     w.d, r.order, r.w, gwork.d, gdx.d, dg, gdw.d, 0, sc),
			          "expert-bwd pairs");
			free(sc.p);
			expect_close(&gx, x.f, m * NH, tol, "x rows (their dx)");
			expect_close(&gdx, dx.f, NT * NH, tol, "dx");
			expect_close(&gdw, dw.f, W, tol, "dweights");
			const double err = rel_err(dg, dg_c, NP);
			if (!(err <= tol))
				fail_msg("dg (%s): relative error %.3g", variant, err);

			/* No rows: forward writes nothing; backward zeroes or keeps. */
			const int64_t none[MNE] = {0};
			struct tbuf keep = tb_copy(&gout);
			expect_rc(rmoe_cuda_expert_ffn(NULL, blas, bf16, NH, F, MNE, none, 0, x.d, w.d, gwork.d, gout.d),
			          "expert-ffn, no rows");
			expect_same_bits(gout.d, keep.d, (size_t)gout.n * elsize(bf16), "out, no rows");
			for (int accumulate = 0; accumulate < 2; accumulate++) {
				struct tbuf before = tb_copy(&gdw);
				sc = scratch_of(rmoe_cuda_expert_bwd_scratch(0, NP, MNE));
				expect_rc(rmoe_cuda_expert_bwd_pairs(NULL, blas, bf16, NH, F, MNE, none, 0, NP, 0, NK, accumulate,
				                                     gx.d, dy.d, w.d, r.order, r.w, gwork.d, gdx.d, dg, gdw.d, 0, sc),
				          "expert-bwd pairs, no rows");
				free(sc.p);
				if (accumulate) {
					expect_same_bits(gdw.d, before.d, (size_t)gdw.n * elsize(bf16), "dweights kept, no rows");
				} else {
					memset(before.d, 0, (size_t)before.n * elsize(bf16));
					expect_same_bits(gdw.d, before.d, (size_t)gdw.n * elsize(bf16), "dweights zeroed, no rows");
				}
				tb_free(&before);
			}
			tb_free(&keep);
			tb_free(&x);
			tb_free(&dy);
			tb_free(&w);
			tb_free(&work);
			tb_free(&out);
			tb_free(&dx);
			tb_free(&dw);
			tb_free(&gout);
			tb_free(&gwork);
			tb_free(&gx);
			tb_free(&gdx);
			tb_free(&gdw);
		}
}

/* ---- small ops ------------------------------------------------------------------------------ */

static void test_cuda_host_accumulate_zero(void **state)
{
	(void)state;
	const int64_t n = 1000;
	for (int bf16 = 0; bf16 < 2; bf16++) {
		set_variant("bf16=%d", bf16);
		struct tbuf src = tb_new(n, bf16, 1.0), dst = tb_new(n, bf16, 1.0);
		struct tbuf want = tb_copy(&dst);
		rmoe_kernel_accumulate(n, src.f, want.f);
		tb_sync(&want);
		expect_rc(rmoe_cuda_accumulate(NULL, bf16, n, src.d, dst.d), "accumulate");
		expect_same_bits(dst.d, want.d, (size_t)n * elsize(bf16), "dst += src");
		expect_rc(rmoe_cuda_zero(NULL, elsize(bf16), n, dst.d), "zero");
		memset(want.d, 0, (size_t)n * elsize(bf16));
		expect_same_bits(dst.d, want.d, (size_t)n * elsize(bf16), "dst = 0");
		tb_free(&src);
		tb_free(&dst);
		tb_free(&want);
	}
}

/* A partition padded to more rows and brought back: the first elements
 * copied, the rest zero, bit for bit as the CPU kernel (which works on the
 * fp32 copies of bf16 buffers, so bf16 is compared through them). */
static void test_cuda_host_copy_pad(void **state)
{
	(void)state;
	const int64_t small = 300, large = 1000;
	for (int bf16 = 0; bf16 < 2; bf16++)
		for (int grow = 0; grow < 2; grow++) {
			set_variant("bf16=%d grow=%d", bf16, grow);
			const int64_t ns = grow ? small : large, nd = grow ? large : small;
			struct tbuf src = tb_new(ns, bf16, 1.0), dst = tb_new(nd, bf16, 1.0), want = tb_new(nd, bf16, 1.0);
			rmoe_kernel_copy_pad(ns, nd, src.f, want.f);
			tb_sync(&want);
			expect_rc(rmoe_cuda_copy_pad(NULL, elsize(bf16), ns, nd, src.d, dst.d), "copy-pad");
			expect_same_bits(dst.d, want.d, (size_t)nd * elsize(bf16), "dst = src, padded");
			tb_free(&src);
			tb_free(&dst);
			tb_free(&want);
		}
}

/* Three peers, the second without rows (NULL), four local experts. */
static void test_cuda_host_sort_chunks(void **state)
{
	(void)state;
	const int64_t H = 5, np = 3, ne = 4, counts[12] = {2, 0, 3, 1, 0, 0, 0, 0, 4, 1, 0, 2};
	int64_t rows[3] = {0}, total = 0;
	for (int q = 0; q < np; q++)
		for (int e = 0; e < ne; e++)
			rows[q] += counts[q * ne + e];
	for (int q = 0; q < np; q++)
		total += rows[q];
	for (int bf16 = 0; bf16 < 2; bf16++) {
		set_variant("bf16=%d", bf16);
		struct tbuf peer[3], sorted = tb_new(total * H, bf16, 1.0);
		float *peer_f[3];
		void *peer_d[3];
		for (int q = 0; q < np; q++) {
			peer[q] = tb_new(rows[q] * H, bf16, 1.0);
			peer_f[q] = rows[q] ? peer[q].f : NULL;
			peer_d[q] = rows[q] ? peer[q].d : NULL;
		}
		rmoe_kernel_sort_chunks(H, np, ne, counts, 1, peer_f, sorted.f);
		struct tbuf want = tb_copy(&sorted);
		tb_sync(&want);
		tb_poison(&sorted);
		expect_rc(rmoe_cuda_sort_chunks(NULL, elsize(bf16), H, np, ne, counts, 1, peer_d, sorted.d), "sort");
		expect_same_bits(sorted.d, want.d, (size_t)sorted.n * elsize(bf16), "sorted");
		/* And back, into poisoned peers. */
		struct tbuf back[3];
		for (int q = 0; q < np; q++) {
			back[q] = tb_copy(&peer[q]);
			tb_poison(&peer[q]);
		}
		expect_rc(rmoe_cuda_sort_chunks(NULL, elsize(bf16), H, np, ne, counts, 0, peer_d, sorted.d), "unsort");
		for (int q = 0; q < np; q++) {
			expect_same_bits(peer[q].d, back[q].d, (size_t)peer[q].n * elsize(bf16), "peer rows");
			tb_free(&peer[q]);
			tb_free(&back[q]);
		}
		tb_free(&sorted);
		tb_free(&want);
	}
}

/* ---- failures -------------------------------------------------------------------------------- */

/* A failed launch, GEMM or scratch allocation comes back as its own code,
 * whichever call of the launcher fails. */
static void test_cuda_host_errors(void **state)
{
	(void)state;
	struct tbuf x = tb_new(XM * NH, 1, 1.0), w = tb_new(XW(NF), 1, 0.3), work = tb_new(3 * XM * NF, 1, 1.0);
	struct tbuf out = tb_new(XM * NH, 1, 1.0);
	set_variant("expert-ffn bf16");
	rmoe_cuda_host_reset_counts();
	expect_rc(rmoe_cuda_expert_ffn(NULL, blas, 1, NH, NF, XNE, xrpe, XM, x.d, w.d, work.d, out.d), "expert-ffn");
	struct rmoe_cuda_host_counts all;
	rmoe_cuda_host_counts(&all);
	/* The grouped way: a pointer upload, SwiGLU; gate and up, then down. */
	assert_true(all.launches >= 2 && all.gemms >= 2);
	for (long i = 1; i <= all.launches; i++) {
		rmoe_cuda_host_fail_launch((int)i);
		assert_int_equal(rmoe_cuda_expert_ffn(NULL, blas, 1, NH, NF, XNE, xrpe, XM, x.d, w.d, work.d, out.d),
		                 RMOE_CUDA_ELAUNCH);
	}
	for (long i = 1; i <= all.gemms; i++) {
		rmoe_cuda_host_fail_gemm((int)i, CUBLAS_STATUS_EXECUTION_FAILED);
		assert_int_equal(rmoe_cuda_expert_ffn(NULL, blas, 1, NH, NF, XNE, xrpe, XM, x.d, w.d, work.d, out.d),
		                 RMOE_CUDA_ECUBLAS);
	}
	/* A grouped call cuBLAS refuses as not supported is made a call per
	 * expert instead: the same bits; any other way, the loop's GEMMs
	 * refused so are failures. */
	struct tbuf want = tb_copy(&out);
	rmoe_cuda_host_fail_gemm(1, CUBLAS_STATUS_NOT_SUPPORTED);
	rmoe_cuda_host_reset_counts();
	expect_rc(rmoe_cuda_expert_ffn(NULL, blas, 1, NH, NF, XNE, xrpe, XM, x.d, w.d, work.d, out.d),
	          "expert-ffn, grouped refused");
	rmoe_cuda_host_counts(&all);
	assert_int_equal(all.gemms, 2 + 2 * 2); /* refused, its 2 experts' 2 problems, then down */
	expect_same_bits(out.d, want.d, (size_t)out.n * 2, "out, grouped refused");
	tb_free(&want);
	assert_int_equal(rmoe_cuda_gemm_select("loop"), 0);
	rmoe_cuda_host_fail_gemm(1, CUBLAS_STATUS_NOT_SUPPORTED);
	assert_int_equal(rmoe_cuda_expert_ffn(NULL, blas, 1, NH, NF, XNE, xrpe, XM, x.d, w.d, work.d, out.d),
	                 RMOE_CUDA_ECUBLAS);
	assert_int_equal(rmoe_cuda_gemm_select(NULL), 0);
	/* Its pointer arrays' allocation (no scratch argument). */
	rmoe_cuda_host_fail_malloc(1);
	assert_int_equal(rmoe_cuda_expert_ffn(NULL, blas, 1, NH, NF, XNE, xrpe, XM, x.d, w.d, work.d, out.d),
	                 RMOE_CUDA_ERUNTIME);
	/* A handle cuBLAS does not know. */
	assert_int_equal(rmoe_cuda_expert_ffn(NULL, NULL, 1, NH, NF, XNE, xrpe, XM, x.d, w.d, work.d, out.d),
	                 RMOE_CUDA_ECUBLAS);
	/* The router's bf16 rows without a declared scratch: the allocation. */
	float *wr = xmalloc(NH * 5 * sizeof(float)), *probs = xmalloc(XM * 5 * sizeof(float));
	float *tw = xmalloc(XM * 2 * sizeof(float));
	int32_t *idx = xmalloc(XM * 2 * sizeof(int32_t));
	fill(wr, NH * 5, 0.5);
	struct rmoe_cuda_scratch none = {NULL, 0};
	rmoe_cuda_host_fail_malloc(1);
	assert_int_equal(rmoe_cuda_router_fwd(NULL, blas, 1, XM, NH, 5, 2, 1, x.d, wr, probs, idx, tw, none),
	                 RMOE_CUDA_ERUNTIME);
	/* The scatter-add's launches, one by one. */
	struct routing r;
	route(&r);
	struct tbuf rows = tb_new(NP * NH, 0, 1.0), dst = tb_new(NT * NH, 0, 1.0);
	struct rmoe_cuda_scratch sc = scratch_of(rmoe_cuda_rows_add_scratch(1, NP));
	rmoe_cuda_host_reset_counts();
	expect_rc(rmoe_cuda_scatter_add(NULL, 0, NH, NK, NP, 0, NP, rows.d, r.order, r.w, dst.d, 1, sc), "scatter-add");
	rmoe_cuda_host_counts(&all);
	assert_int_equal(all.launches, 3);
	for (long i = 1; i <= all.launches; i++) {
		rmoe_cuda_host_fail_launch((int)i);
		assert_int_equal(rmoe_cuda_scatter_add(NULL, 0, NH, NK, NP, 0, NP, rows.d, r.order, r.w, dst.d, 1, sc),
		                 RMOE_CUDA_ELAUNCH);
	}
	/* What a task's status then records (rmoe_cl_cuda_done: any non-zero
	 * code fails the task as a mis-sized buffer does, tests/mpi/
	 * test_task_errors.c): each code's own words. */
	assert_non_null(strstr(rmoe_cuda_status_what(RMOE_CUDA_ELAUNCH), "kernel launch"));
	assert_non_null(strstr(rmoe_cuda_status_what(RMOE_CUDA_ERUNTIME), "runtime call"));
	assert_non_null(strstr(rmoe_cuda_status_what(RMOE_CUDA_ECUBLAS), "cuBLAS"));
	rmoe_cuda_host_fail_launch(0);
	rmoe_cuda_host_fail_gemm(0, CUBLAS_STATUS_SUCCESS);
	rmoe_cuda_host_fail_malloc(0);
	free(sc.p);
	free(wr);
	free(probs);
	free(tw);
	free(idx);
	tb_free(&rows);
	tb_free(&dst);
	tb_free(&x);
	tb_free(&w);
	tb_free(&work);
	tb_free(&out);
}

/* ---- the GEMM shapes ----------------------------------------------------------------------- */

/* Every GEMM problem of the tests above, by (op A, op B, types, beta 0 or
 * not): what the launchers ask of cuBLAS, so that the row-major mapping
 * is checked in each shape it takes. Types: 0 fp32, 1 bf16, 2 bf16
 * operands into fp32 (the bf16 router). */
static unsigned shapes_seen[2][2][3][2];

static void on_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, int lda, int ldb, int ldc,
                    cudaDataType at, cudaDataType bt, cudaDataType ct, float beta)
{
	(void)m;
	(void)n;
	(void)k;
	(void)lda;
	(void)ldb;
	(void)ldc;
	(void)bt;
	const int types = at == CUDA_R_32F ? 0 : ct == CUDA_R_16BF ? 1 : 2;
	shapes_seen[ta == CUBLAS_OP_T][tb == CUBLAS_OP_T][types][beta != 0.0f]++;
}

static void test_cuda_host_gemm_shapes(void **state)
{
	(void)state;
	/* rmoe_gemm_rm(ta, tb) is cuBLAS's (op B, op A): row-major A B, A^T B
	 * and A B^T are cuBLAS's NN, NT and TN. */
	static const struct {
		int ta, tb, types, beta;
		const char *what;
	} want[] = {
		{0, 0, 0, 0, "x w (fp32: expert forward, router logits)"},
		{0, 0, 1, 0, "x w (bf16: expert forward)"},
		{0, 0, 2, 0, "x w_hi (bf16 router logits)"},
		{0, 0, 2, 1, "x w_mid, x w_lo added to the logits (bf16 router)"},
		{0, 1, 0, 0, "x^T dlogits, act^T dy (fp32)"},
		{0, 1, 0, 1, "x^T dpre into accumulated dweights, router dw over row blocks (fp32)"},
		{0, 1, 1, 0, "x^T dpre, act^T dy (bf16)"},
		{0, 1, 1, 1, "x^T dpre into accumulated dweights (bf16)"},
		{0, 1, 2, 0, "x^T d_lo (bf16 router dw)"},
		{0, 1, 2, 1, "x^T d_hi, x^T d_mid added to the router's dw (bf16 router)"},
		{1, 0, 0, 0, "dy w_down^T (fp32)"},
		{1, 0, 0, 1, "dpre_up w_up^T added to dx, router dx (fp32)"},
		{1, 0, 1, 0, "dy w_down^T (bf16)"},
		{1, 0, 1, 1, "dpre_up w_up^T added to dx, the bf16 router's dx (bf16)"},
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		if (!shapes_seen[want[i].ta][want[i].tb][want[i].types][want[i].beta])
			fail_msg("no GEMM problem of shape op A=%c op B=%c types %d beta%s0: %s", want[i].ta ? 'T' : 'N',
			         want[i].tb ? 'T' : 'N', want[i].types, want[i].beta ? "!=" : "=", want[i].what);
	rmoe_cuda_host_on_gemm(NULL);
}

int main(void)
{
	rmoe_cuda_host_on_gemm(on_gemm);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_cuda_host_router_fwd, setup),
		cmocka_unit_test_setup(test_cuda_host_router_bwd, setup),
		cmocka_unit_test_setup(test_cuda_host_dispatch_map, setup),
		cmocka_unit_test_setup(test_cuda_host_gather, setup),
		cmocka_unit_test_setup(test_cuda_host_scatter_add, setup),
		cmocka_unit_test_setup(test_cuda_host_unpermute_bwd, setup),
		cmocka_unit_test_setup(test_cuda_host_shared_gate, setup),
		cmocka_unit_test_setup_teardown(test_cuda_host_expert_ffn, setup, way_teardown),
		cmocka_unit_test_setup_teardown(test_cuda_host_expert_bwd_pairs, setup, way_teardown),
		cmocka_unit_test_setup_teardown(test_cuda_host_expert_bwd_preweighted, setup, way_teardown),
		cmocka_unit_test_setup_teardown(test_cuda_host_gemm_ways, setup, way_teardown),
		cmocka_unit_test_setup_teardown(test_cuda_host_expert_many, setup, way_teardown),
		cmocka_unit_test_setup(test_cuda_host_accumulate_zero, setup),
		cmocka_unit_test_setup(test_cuda_host_copy_pad, setup),
		cmocka_unit_test_setup(test_cuda_host_sort_chunks, setup),
		cmocka_unit_test_setup(test_cuda_host_errors, setup),
		cmocka_unit_test_setup(test_cuda_host_gemm_shapes, setup),
	};
	return cmocka_run_group_tests_name("cuda-host", tests, group_setup, group_teardown);
}
