/* The expert GEMMs of one partition: one cuBLAS call per matrix for all
 * the partition's experts. One cublasGemmEx per expert and matrix (1408
 * calls a step at the Qwen3-30B-A3B layer, each with too few output tiles
 * to fill the card's SMs) is what this replaces. Three ways, chosen at run
 * time (rmoe_cuda_gemm_select: RMOE_CUDA_GEMM) and measured against each other by
 * bench/gpu/gemm_rate.cu:
 *   grouped  cublasGemmGroupedBatchedEx: a group per expert with rows, the
 *            expert's problems of the call in it (gate and up: two, of one
 *            shape); the per-problem pointers in device arrays uploaded
 *            from the host once per launcher;
 *   strided  cublasGemmStridedBatchedEx over each expert's rows padded with
 *            zero rows to the largest expert's count, copied into and out
 *            of stream-ordered scratch: one call per matrix and problem, its
 *            batch every expert of the partition (an empty one contributes
 *            zeros, which is its gradient);
 *   loop     one cublasGemmEx per expert and problem: the former path.
 * The default is grouped where cuBLAS has it (12.5 and later), else strided;
 * a grouped call cuBLAS refuses as not supported (its type table, sizes)
 * is made the loop's way instead, and said once. Every way computes each
 * expert's product with fp32 accumulation (CUBLAS_COMPUTE_32F) in the
 * storage type.
 *
 * Header-only (static functions), shared by cuda_expert.cu and
 * bench/gpu/gemm_rate.cu, so that the benchmark times the launchers' own
 * calls. */
#ifndef RMOE_CUDA_GEMM_CUH
#define RMOE_CUDA_GEMM_CUH

#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

/* The one place the toolkit's version decides: cublasGemmGroupedBatchedEx
 * came with cuBLAS 12.5. */
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
#define RMOE_HAVE_GROUPED_GEMM 1
#else
#define RMOE_HAVE_GROUPED_GEMM 0
#endif

enum rmoe_gemm_way { RMOE_GEMM_GROUPED, RMOE_GEMM_STRIDED, RMOE_GEMM_LOOP, RMOE_GEMM_WAYS };

static inline const char *rmoe_gemm_way_name(int way)
{
	return way == RMOE_GEMM_GROUPED ? "grouped" : way == RMOE_GEMM_STRIDED ? "strided" : "loop";
}

/* The way rmoe_cuda_gemm_select chose (cuda_expert.cu holds it): the
 * kernels read no environment; the codelets' runtime hands them
 * RMOE_CUDA_GEMM when StarPU starts (codelets/runtime/cuda.c). */
static inline int rmoe_gemm_way(void)
{
	return rmoe_cuda_gemm_way();
}

/* ---- host words into device memory ---------------------------------------------------- */

/* The words travel as a launch's arguments, which the launch copies: the
 * host buffer may go at once, and nothing waits (a cudaMemcpyAsync from
 * pageable memory may wait for the stream). 480 words keep the arguments
 * within the 4 KiB every device takes. */
#define RMOE_UPLOAD_WORDS 480
struct rmoe_upload_words {
	uint64_t w[RMOE_UPLOAD_WORDS];
};

static __global__ void rmoe_upload_k(int n, struct rmoe_upload_words v, uint64_t *dst)
{
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		dst[i] = v.w[i];
}

static inline int rmoe_upload(cudaStream_t s, const uint64_t *host, int64_t n, uint64_t *dev)
{
	for (int64_t at = 0; at < n; at += RMOE_UPLOAD_WORDS) {
		struct rmoe_upload_words v = {};
		const int c = (int)(n - at < RMOE_UPLOAD_WORDS ? n - at : RMOE_UPLOAD_WORDS);
		memcpy(v.w, host + at, (size_t)c * sizeof(uint64_t));
		RMOE_LAUNCH(rmoe_upload_k, 1, 128, 0, s, c, v, dev + at);
		const int rc = rmoe_cuda_check("upload");
		if (rc)
			return rc;
	}
	return 0;
}

/* ---- one call over the experts --------------------------------------------------------- */

/* An operand: expert e's matrix of problem j starts base + o_e*row +
 * e*expert + j*problem elements in (o_e: the expert's first row in the
 * partition), ld its row stride. A rows operand (row != 0: rows of the
 * partition, one per row, row == ld) has the expert's rows; the others
 * (weights, their gradients) a matrix per expert. */
struct rmoe_xop {
	const void *base;
	int64_t row, expert, problem, ld;
};

/* Row-major C = alpha op(A) op(B) + beta C per expert with rows and per
 * problem, op(A) [m, k], op(B) [k, n]: the expert's rows stand for m
 * (rows_in 'm') or k ('k'); the other sizes fixed. */
struct rmoe_xgemm {
	int ta, tb;
	char rows_in;
	int64_t m, n, k;
	int problems;
	float alpha, beta;
	struct rmoe_xop a, b, c;
};

/* The calls of one launcher, over its partition's experts. */
#define RMOE_XGEMM_MAX 8
struct rmoe_xplan {
	cudaStream_t s;
	cublasHandle_t b;
	struct rmoe_arena *arena;
	int way;
	cudaDataType_t ty;
	size_t es;
	int64_t ne, groups, rmax;
	const struct rmoe_xgemm *g;
	int ng;
	int64_t *first;    /* host [ne + 1]: the experts' first rows, then m */
	uint64_t *ptrs;    /* grouped: per call the pointers of A, B, C (device) */
	int64_t ptr_at[RMOE_XGEMM_MAX];
	void *hostv;       /* grouped: the per-group arguments (host) */
	int64_t *dfirst;   /* strided: first on the device */
	char *pad;         /* strided: the padded operands */
};

static inline const char *rmoe_xop_at(const struct rmoe_xplan *p, const struct rmoe_xop *o, int64_t e, int j)
{
	return (const char *)o->base + p->es * (size_t)(p->first[e] * o->row + e * o->expert + j * o->problem);
}

static inline int64_t rmoe_xgemm_m(const struct rmoe_xgemm *g, int64_t rows)
{
	return g->rows_in == 'm' ? rows : g->m;
}

static inline int64_t rmoe_xgemm_k(const struct rmoe_xgemm *g, int64_t rows)
{
	return g->rows_in == 'k' ? rows : g->k;
}

/* The device bytes of the pointer arrays of the grouped way for calls of
 * problems problems per expert in all, over n_experts: what a task may
 * declare as scratch for them (rmoe_arena_take's rounding included). */
static inline size_t rmoe_xgemm_ptr_bytes(int64_t n_experts, int problems)
{
	return n_experts > 0 ? rmoe_arena_size((size_t)(3 * n_experts * problems) * sizeof(uint64_t)) : 0;
}

/* The per-group arguments of one grouped call, in one host block. */
struct rmoe_xgroups {
	cublasOperation_t *ta, *tb;
	int *m, *n, *k, *lda, *ldb, *ldc, *size;
	float *alpha, *beta;
};

static inline struct rmoe_xgroups rmoe_xgroups_of(void *block, int64_t G)
{
	struct rmoe_xgroups x;
	x.ta = (cublasOperation_t *)block;
	x.tb = x.ta + G;
	x.m = (int *)(x.tb + G);
	x.n = x.m + G;
	x.k = x.n + G;
	x.lda = x.k + G;
	x.ldb = x.lda + G;
	x.ldc = x.ldb + G;
	x.size = x.ldc + G;
	x.alpha = (float *)(x.size + G);
	x.beta = x.alpha + G;
	return x;
}

/* Padded copies for the strided way: row q = e*rmax + i of dst is row i
 * of expert e in src (its rows from first[e]), or zeros past its count. */
template <typename T, int V>
static __global__ void rmoe_pad_k(rmoe_width<V>, int64_t ne, int64_t rmax, int64_t width,
                                  const int64_t *__restrict__ first, const T *__restrict__ src, T *__restrict__ dst)
{
	const float zero[V] = {};
	for (int64_t q = rmoe_warp_id(); q < ne * rmax; q += rmoe_warps()) {
		const int64_t e = q / rmax, i = q % rmax;
		T *d = dst + q * width;
		if (i < first[e + 1] - first[e]) {
			const T *s = src + (first[e] + i) * width;
			for (int64_t j = rmoe_lane() * V; j < width; j += RMOE_WARP * V)
				rmoe_io<T, V>::cp(d + j, s + j);
		} else {
			for (int64_t j = rmoe_lane() * V; j < width; j += RMOE_WARP * V)
				rmoe_io<T, V>::st(d + j, zero);
		}
	}
}

/* And back: row q of dst from its expert's padded row. */
template <typename T, int V>
static __global__ void rmoe_unpad_k(rmoe_width<V>, int64_t ne, int64_t m, int64_t rmax, int64_t width,
                                    const int64_t *__restrict__ first, const T *__restrict__ src, T *__restrict__ dst)
{
	for (int64_t q = rmoe_warp_id(); q < m; q += rmoe_warps()) {
		int64_t lo = 0, hi = ne; /* the last expert whose first row is <= q */
		while (hi - lo > 1) {
			const int64_t mid = (lo + hi) / 2;
			if (first[mid] <= q)
				lo = mid;
			else
				hi = mid;
		}
		const T *s = src + (lo * rmax + q - first[lo]) * width;
		for (int64_t j = rmoe_lane() * V; j < width; j += RMOE_WARP * V)
			rmoe_io<T, V>::cp(dst + q * width + j, s + j);
	}
}

template <typename T>
static inline int rmoe_xpad_t(const struct rmoe_xplan *p, int back, int64_t width, const void *src, void *dst)
{
	const int64_t rows = back ? p->first[p->ne] : p->ne * p->rmax;
	const unsigned grid = rmoe_cuda_warp_rows(rows);
	const bool vec = rmoe_vec_ok<T>(width, {src, dst});
	if (back && vec)
		RMOE_LAUNCH(rmoe_unpad_k, grid, RMOE_CUDA_THREADS, 0, p->s, rmoe_width<rmoe_vec<T>::n>(), p->ne, rows, p->rmax,
		            width, (const int64_t *)p->dfirst, (const T *)src, (T *)dst);
	else if (back)
		RMOE_LAUNCH(rmoe_unpad_k, grid, RMOE_CUDA_THREADS, 0, p->s, rmoe_width<1>(), p->ne, rows, p->rmax, width,
		            (const int64_t *)p->dfirst, (const T *)src, (T *)dst);
	else if (vec)
		RMOE_LAUNCH(rmoe_pad_k, grid, RMOE_CUDA_THREADS, 0, p->s, rmoe_width<rmoe_vec<T>::n>(), p->ne, p->rmax, width,
		            (const int64_t *)p->dfirst, (const T *)src, (T *)dst);
	else
		RMOE_LAUNCH(rmoe_pad_k, grid, RMOE_CUDA_THREADS, 0, p->s, rmoe_width<1>(), p->ne, p->rmax, width,
		            (const int64_t *)p->dfirst, (const T *)src, (T *)dst);
	return rmoe_cuda_check(back ? "unpad rows" : "pad rows");
}

/* Rows of width elements: into padded (back 0) or out of it (back 1). */
static inline int rmoe_xpad(const struct rmoe_xplan *p, int back, int64_t width, const void *src, void *dst)
{
	if (p->es == 2)
		return rmoe_xpad_t<rmoe_bf16_t>(p, back, width, src, dst);
	return rmoe_xpad_t<float>(p, back, width, src, dst);
}

/* The padded size of a rows operand, 0 for the others. */
static inline size_t rmoe_xpad_bytes(const struct rmoe_xplan *p, const struct rmoe_xop *o)
{
	return o->row ? rmoe_arena_size((size_t)(p->ne * p->rmax * o->ld) * p->es) : 0;
}

static inline void rmoe_xplan_end(struct rmoe_xplan *p)
{
	free(p->first);
	free(p->hostv);
	p->first = NULL;
	p->hostv = NULL;
}

/* Prepares the ng calls g (kept, not copied) over ne experts of rpe[e]
 * rows each (host), elements of type ty (es bytes), for the way
 * rmoe_gemm_way() says: the grouped way's pointer arrays and the strided
 * way's padded space come from the arena (the task's scratch, else
 * stream-ordered allocations). rmoe_xplan_end after, whatever it returns. */
static inline int rmoe_xplan_start(struct rmoe_xplan *p, cudaStream_t s, cublasHandle_t b, struct rmoe_arena *arena,
                                   cudaDataType_t ty, size_t es, int64_t ne, const int64_t *rpe,
                                   const struct rmoe_xgemm *g, int ng)
{
	memset(p, 0, sizeof(*p));
	p->s = s;
	p->b = b;
	p->arena = arena;
	p->way = rmoe_gemm_way();
	p->ty = ty;
	p->es = es;
	p->ne = ne;
	p->g = g;
	p->ng = ng;
	if (ng > RMOE_XGEMM_MAX) {
		fprintf(stderr, "relaymoe: %d expert GEMMs in one plan, more than %d\n", ng, RMOE_XGEMM_MAX);
		return RMOE_CUDA_ERUNTIME;
	}
	if (!(p->first = (int64_t *)malloc((size_t)(ne + 1) * sizeof(int64_t)))) {
		fprintf(stderr, "relaymoe: no host memory for %lld experts' offsets\n", (long long)ne);
		return RMOE_CUDA_ERUNTIME;
	}
	p->first[0] = 0;
	for (int64_t e = 0; e < ne; e++) {
		p->first[e + 1] = p->first[e] + rpe[e];
		p->groups += rpe[e] > 0;
		p->rmax = rpe[e] > p->rmax ? rpe[e] : p->rmax;
	}
	if (p->groups == 0 || p->way == RMOE_GEMM_LOOP)
		return 0;
	int rc = 0;
	if (p->way == RMOE_GEMM_GROUPED) {
		int64_t words = 0;
		for (int i = 0; i < ng; i++) {
			p->ptr_at[i] = words;
			words += 3 * p->groups * g[i].problems;
		}
		const size_t per = 2 * sizeof(cublasOperation_t) + 7 * sizeof(int) + 2 * sizeof(float);
		uint64_t *host = (uint64_t *)malloc((size_t)words * sizeof(uint64_t));
		if (!host || !(p->hostv = malloc((size_t)p->groups * per))) {
			free(host);
			fprintf(stderr, "relaymoe: no host memory for %lld GEMM pointers\n", (long long)words);
			return RMOE_CUDA_ERUNTIME;
		}
		/* Per call: cuBLAS's (column-major) A array, that of our B, then
		 * our A's, then C's; group after group, a group's problems in a
		 * row. */
		for (int i = 0; i < ng; i++) {
			const int64_t P = p->groups * g[i].problems;
			uint64_t *w = host + p->ptr_at[i];
			int64_t q = 0;
			for (int64_t e = 0; e < ne; e++)
				for (int j = 0; rpe[e] > 0 && j < g[i].problems; j++, q++) {
					w[q] = (uint64_t)(uintptr_t)rmoe_xop_at(p, &g[i].b, e, j);
					w[P + q] = (uint64_t)(uintptr_t)rmoe_xop_at(p, &g[i].a, e, j);
					w[2 * P + q] = (uint64_t)(uintptr_t)rmoe_xop_at(p, &g[i].c, e, j);
				}
		}
		rc = rmoe_arena_take(arena, (size_t)words * sizeof(uint64_t), (void **)&p->ptrs);
		if (!rc)
			rc = rmoe_upload(s, host, words, p->ptrs);
		free(host);
		return rc;
	}
	size_t pad = 0;
	for (int i = 0; i < ng; i++) {
		const size_t need = rmoe_xpad_bytes(p, &g[i].a) + rmoe_xpad_bytes(p, &g[i].b) + rmoe_xpad_bytes(p, &g[i].c);
		pad = need > pad ? need : pad;
	}
	rc = rmoe_arena_take(arena, (size_t)(ne + 1) * sizeof(int64_t), (void **)&p->dfirst);
	if (!rc)
		rc = rmoe_upload(s, (const uint64_t *)p->first, ne + 1, (uint64_t *)p->dfirst);
	if (!rc && pad)
		rc = rmoe_arena_take(arena, pad, (void **)&p->pad);
	return rc;
}

static inline int rmoe_xrun_loop(const struct rmoe_xplan *p, const struct rmoe_xgemm *g)
{
	int rc = 0;
	for (int64_t e = 0; e < p->ne && !rc; e++) {
		const int64_t r = p->first[e + 1] - p->first[e];
		for (int j = 0; r > 0 && j < g->problems && !rc; j++)
			rc = rmoe_gemm_rm(p->b, g->ta, g->tb, rmoe_xgemm_m(g, r), g->n, rmoe_xgemm_k(g, r), g->alpha,
			                  rmoe_xop_at(p, &g->a, e, j), p->ty, g->a.ld, rmoe_xop_at(p, &g->b, e, j), p->ty,
			                  g->b.ld, g->beta, (void *)rmoe_xop_at(p, &g->c, e, j), p->ty, g->c.ld);
	}
	return rc;
}

/* cuBLAS's status of the grouped call i. */
static inline cublasStatus_t rmoe_xrun_grouped(const struct rmoe_xplan *p, int i)
{
#if RMOE_HAVE_GROUPED_GEMM
	const struct rmoe_xgemm *g = &p->g[i];
	const struct rmoe_xgroups x = rmoe_xgroups_of(p->hostv, p->groups);
	int64_t q = 0;
	/* Row-major C = op(A) op(B) is cuBLAS's C^T = op(B)^T op(A)^T, as
	 * rmoe_gemm_rm. */
	for (int64_t e = 0; e < p->ne; e++) {
		const int64_t r = p->first[e + 1] - p->first[e];
		if (r == 0)
			continue;
		x.ta[q] = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
		x.tb[q] = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
		x.m[q] = (int)g->n;
		x.n[q] = (int)rmoe_xgemm_m(g, r);
		x.k[q] = (int)rmoe_xgemm_k(g, r);
		x.lda[q] = (int)g->b.ld;
		x.ldb[q] = (int)g->a.ld;
		x.ldc[q] = (int)g->c.ld;
		x.size[q] = g->problems;
		x.alpha[q] = g->alpha;
		x.beta[q] = g->beta;
		q++;
	}
	const int64_t P = p->groups * g->problems;
	const uint64_t *w = p->ptrs + p->ptr_at[i];
	return cublasGemmGroupedBatchedEx(p->b, x.ta, x.tb, x.m, x.n, x.k, x.alpha, (const void *const *)w, p->ty, x.lda,
	                                  (const void *const *)(w + P), p->ty, x.ldb, x.beta, (void *const *)(w + 2 * P),
	                                  p->ty, x.ldc, (int)p->groups, x.size, CUBLAS_COMPUTE_32F);
#else
	(void)p;
	(void)i;
	return CUBLAS_STATUS_NOT_SUPPORTED;
#endif
}

static inline int rmoe_xrun_strided(const struct rmoe_xplan *p, const struct rmoe_xgemm *g)
{
	const struct rmoe_xop *op[3] = {&g->a, &g->b, &g->c};
	char *padded[3];
	char *at = p->pad;
	for (int x = 0; x < 3; x++) {
		padded[x] = op[x]->row ? at : NULL;
		at += rmoe_xpad_bytes(p, op[x]);
	}
	int rc = 0;
	for (int j = 0; j < g->problems && !rc; j++) {
		const void *base[3];
		long long stride[3];
		for (int x = 0; x < 3 && !rc; x++) {
			const char *src = (const char *)op[x]->base + p->es * (size_t)(j * op[x]->problem);
			base[x] = padded[x] ? padded[x] : src;
			stride[x] = padded[x] ? (long long)(p->rmax * op[x]->ld) : (long long)op[x]->expert;
			/* An input padded once serves every problem that shares it;
			 * C only when beta adds to what it holds. */
			const int need = padded[x] && (j == 0 || op[x]->problem) && (x < 2 || g->beta != 0.0f);
			if (need)
				rc = rmoe_xpad(p, 0, op[x]->ld, src, padded[x]);
		}
		const int64_t M = rmoe_xgemm_m(g, p->rmax), K = rmoe_xgemm_k(g, p->rmax);
		if (!rc)
			rc = rmoe_cublas_ok(cublasGemmStridedBatchedEx(p->b, g->tb ? CUBLAS_OP_T : CUBLAS_OP_N,
			                                               g->ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)g->n, (int)M,
			                                               (int)K, &g->alpha, base[1], p->ty, (int)g->b.ld, stride[1],
			                                               base[0], p->ty, (int)g->a.ld, stride[0], &g->beta,
			                                               (void *)base[2], p->ty, (int)g->c.ld, stride[2],
			                                               (int)p->ne, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
			                    "cublasGemmStridedBatchedEx");
		if (!rc && padded[2])
			rc = rmoe_xpad(p, 1, g->c.ld, padded[2], (char *)g->c.base + p->es * (size_t)(j * g->c.problem));
	}
	return rc;
}

/* Call i of the plan, in the stream's order. */
static inline int rmoe_xplan_run(const struct rmoe_xplan *p, int i)
{
	const struct rmoe_xgemm *g = &p->g[i];
	if (p->groups == 0 || g->n == 0)
		return 0;
	if (p->way == RMOE_GEMM_GROUPED) {
		const cublasStatus_t st = rmoe_xrun_grouped(p, i);
		if (st != CUBLAS_STATUS_NOT_SUPPORTED)
			return rmoe_cublas_ok(st, "cublasGemmGroupedBatchedEx");
		static int said;
		if (!said) {
			said = 1;
			fprintf(stderr, "relaymoe: cublasGemmGroupedBatchedEx: %s: a cublasGemmEx per expert instead\n",
			        cublasGetStatusString(st));
		}
		return rmoe_xrun_loop(p, g);
	}
	if (p->way == RMOE_GEMM_STRIDED)
		return rmoe_xrun_strided(p, g);
	return rmoe_xrun_loop(p, g);
}

#endif /* RMOE_CUDA_GEMM_CUH */
