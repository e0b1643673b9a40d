/* Unit tests of the CPU codelets: each one submitted through
 * starpu_task_insert on seeded random inputs and compared with a naive loop
 * in double precision written here. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <starpu.h>

#include "relaymoe/relaymoe.h"
#include "rmoe_codelets.h"
#include "codelets_fixture.h"
#include "rmoe_hash.h"

/* The two modes of the expert backward. */
/* PAIR_ROWS: pair-weighted without a dx target (the lean all-to-all). */
enum { PAIR_WEIGHTED, PREWEIGHTED, PAIR_ROWS };

/* fp32 kernels against double loops: a few units of fp32 rounding over sums
 * of at most a few hundred terms. */
#define TOL_F32 1e-5
/* One fp32 multiply or add per element. */
#define TOL_ONE_OP 1e-6

#define assert_rel_err(err, tol)                                                        \
	do {                                                                            \
		double rel_err_ = (err);                                                \
		if (!(rel_err_ <= (tol)))                                               \
			fail_msg("%s = %.3g, above the tolerance %.3g", #err, rel_err_, \
			         (double)(tol));                                        \
	} while (0)

/* ---- seeded inputs ------------------------------------------------------ */

struct rng {
	uint64_t state;
};

static uint64_t rng_next(struct rng *r)
{
	uint64_t x = r->state;
	r->state += RMOE_GOLDEN_GAMMA;
	return rmoe_splitmix64(x);
}

/* [0, 1) */
static double rng_unit(struct rng *r)
{
	return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

static int64_t rng_below(struct rng *r, int64_t n)
{
	return (int64_t)(rng_unit(r) * (double)n);
}

/* Uniform in [-scale, scale), away from zero. */
static void rng_fill(struct rng *r, float *v, int64_t n, double scale)
{
	for (int64_t i = 0; i < n; i++) {
		double u = 2.0 * rng_unit(r) - 1.0;
		v[i] = (float)(scale * (u >= 0.0 ? 0.05 + 0.95 * u : -0.05 + 0.95 * u));
	}
}

static float *rng_floats(struct rng *r, int64_t n, double scale)
{
	float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
	assert_non_null(v);
	rng_fill(r, v, n, scale);
	return v;
}

static void *xcalloc(int64_t n, size_t size)
{
	void *p = calloc((size_t)(n > 0 ? n : 1), size);
	assert_non_null(p);
	return p;
}

/* Every insertion here goes through the library's insert functions, as
 * the graphs' do, and must succeed. */
#define INSERT(call) assert_int_equal((call), 0)

static const struct rmoe_task_opts *opts(const char *name)
{
	static struct rmoe_task_opts o;
	o = (struct rmoe_task_opts){.name = name};
	return &o;
}

/* ---- StarPU helpers ----------------------------------------------------- */

static starpu_data_handle_t vec_f(float *ptr, int64_t n)
{
	starpu_data_handle_t h;
	starpu_vector_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)ptr, (uint32_t)n, sizeof(float));
	return h;
}

static starpu_data_handle_t vec_i(int32_t *ptr, int64_t n)
{
	starpu_data_handle_t h;
	starpu_vector_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)ptr, (uint32_t)n, sizeof(int32_t));
	return h;
}

/* A temporary (home node -1), freed by StarPU after its last task. */
static starpu_data_handle_t vec_tmp(int64_t n)
{
	starpu_data_handle_t h;
	starpu_vector_data_register(&h, -1, 0, (uint32_t)n, sizeof(float));
	return h;
}

static void unregister_all(starpu_data_handle_t *h, int n)
{
	for (int i = 0; i < n; i++)
		starpu_data_unregister(h[i]);
}

static void wait_all(void)
{
	assert_int_equal(starpu_task_wait_for_all(), 0);
}

/* ---- comparisons -------------------------------------------------------- */

static double rel_err_d(const float *a, const double *ref, int64_t n)
{
	double num = 0.0, den = 0.0;
	for (int64_t i = 0; i < n; i++) {
		num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
		den += ref[i] * ref[i];
	}
	return sqrt(num) / fmax(sqrt(den), 1e-300);
}

static double rel_err_f(const float *a, const float *b, int64_t n)
{
	double num = 0.0, den = 0.0;
	for (int64_t i = 0; i < n; i++) {
		num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		den += (double)b[i] * b[i];
	}
	return sqrt(num) / fmax(sqrt(den), 1e-300);
}

/* ---- reference routing, in double ------------------------------------- */

static void ref_softmax(const float *x, const float *w_router, int64_t H, int64_t E, double *p)
{
	double max = -INFINITY, sum = 0.0;
	for (int64_t e = 0; e < E; e++) {
		double l = 0.0;
		for (int64_t h = 0; h < H; h++)
			l += (double)x[h] * w_router[h * E + e];
		p[e] = l;
		max = fmax(max, l);
	}
	for (int64_t e = 0; e < E; e++) {
		p[e] = exp(p[e] - max);
		sum += p[e];
	}
	for (int64_t e = 0; e < E; e++)
		p[e] /= sum;
}

/* K largest, descending, ties to the lower expert. */
static void ref_topk(const double *p, int64_t E, int64_t K, int32_t *idx)
{
	for (int64_t k = 0; k < K; k++) {
		int64_t best = -1;
		for (int64_t e = 0; e < E; e++) {
			int taken = 0;
			for (int64_t j = 0; j < k; j++)
				taken |= idx[j] == e;
			if (!taken && (best < 0 || p[e] > p[best]))
				best = e;
		}
		idx[k] = (int32_t)best;
	}
}

static void ref_topk_weights(const double *p, const int32_t *idx, int64_t K, int norm, double *w)
{
	double s = 0.0;
	for (int64_t k = 0; k < K; k++)
		s += p[idx[k]];
	for (int64_t k = 0; k < K; k++)
		w[k] = norm ? p[idx[k]] / s : p[idx[k]];
}

static void ref_route(const float *x, const float *w_router, int64_t T, int64_t H, int64_t E, int64_t K,
                      int norm, double *probs, int32_t *idx, double *tw)
{
	for (int64_t t = 0; t < T; t++) {
		ref_softmax(x + t * H, w_router, H, E, probs + t * E);
		ref_topk(probs + t * E, E, K, idx + t * K);
		ref_topk_weights(probs + t * E, idx + t * K, K, norm, tw + t * K);
	}
}

/* K distinct experts per token from the allowed ones (NULL: all); skew > 0
 * favours the first allowed experts (uneven routing). */
static void random_routing(struct rng *r, int64_t T, int64_t K, int64_t E, const int *allowed, int skew,
                           int32_t *idx)
{
	int32_t *list = xcalloc(E, sizeof(int32_t));
	int64_t n = 0;
	for (int64_t e = 0; e < E; e++)
		if (!allowed || allowed[e])
			list[n++] = (int32_t)e;
	assert_true(n >= K);
	for (int64_t t = 0; t < T; t++) {
		for (int64_t k = 0; k < K;) {
			double u = rng_unit(r);
			int32_t e = list[(int64_t)(n * (skew ? u * u * u : u))];
			int taken = 0;
			for (int64_t j = 0; j < k; j++)
				taken |= idx[t * K + j] == e;
			if (!taken)
				idx[t * K + k++] = e;
		}
	}
	free(list);
}

/* Stable sort of the pairs by expert, the obvious way. */
static void ref_dispatch(const int32_t *idx, int64_t T, int64_t K, int64_t E, int32_t *pair_order,
                         int32_t *counts)
{
	int64_t n = 0;
	for (int64_t e = 0; e < E; e++) {
		counts[e] = 0;
		for (int64_t p = 0; p < T * K; p++)
			if (idx[p] == e) {
				pair_order[n++] = (int32_t)p;
				counts[e]++;
			}
	}
}

/* ---- reference expert, in double -------------------------------------- */

struct ref_expert {
	const float *gate, *up, *down; /* [H][F], [H][F], [F][H] */
	int64_t H, F;
};

static struct ref_expert ref_expert_of(const float *partition, int64_t ne, int64_t H, int64_t F,
                                       int64_t e)
{
	struct ref_expert x = {
		.gate = partition + e * H * F,
		.up = partition + (ne + e) * H * F,
		.down = partition + (2 * ne + e) * H * F,
		.H = H,
		.F = F,
	};
	return x;
}

static double ref_sigmoid(double g)
{
	return 1.0 / (1.0 + exp(-g));
}

/* gate, up, act [F]; out [H] (may be NULL). */
static void ref_expert_fwd(const struct ref_expert *x, const float *row, double *gate, double *up,
                           double *act, double *out)
{
	const int64_t H = x->H, F = x->F;
	for (int64_t j = 0; j < F; j++) {
		double g = 0.0, u = 0.0;
		for (int64_t h = 0; h < H; h++) {
			g += (double)row[h] * x->gate[h * F + j];
			u += (double)row[h] * x->up[h * F + j];
		}
		gate[j] = g;
		up[j] = u;
		act[j] = g * ref_sigmoid(g) * u;
	}
	if (out)
		for (int64_t h = 0; h < H; h++) {
			double o = 0.0;
			for (int64_t j = 0; j < F; j++)
				o += act[j] * x->down[j * H + h];
			out[h] = o;
		}
}

/* The backward of g * expert(row) for output gradient dy: dg, dx [H], and
 * the expert's weight gradients added into dw_gate/dw_up [H][F], dw_down [F][H]. */
static double ref_expert_bwd(const struct ref_expert *x, const float *row, const float *dy, double g,
                             double *dx, double *dw_gate, double *dw_up, double *dw_down)
{
	const int64_t H = x->H, F = x->F;
	double *gate = calloc((size_t)(5 * F), sizeof(double));
	assert_non_null(gate);
	double *up = gate + F, *act = gate + 2 * F, *dpre_gate = gate + 3 * F, *dpre_up = gate + 4 * F;
	ref_expert_fwd(x, row, gate, up, act, NULL);
	double dg = 0.0;
	for (int64_t j = 0; j < F; j++) {
		double u = 0.0;
		for (int64_t h = 0; h < H; h++)
			u += (double)dy[h] * x->down[j * H + h];
		dg += u * act[j];
		double dact = g * u, s = ref_sigmoid(gate[j]);
		dpre_up[j] = dact * gate[j] * s;
		dpre_gate[j] = dact * up[j] * s * (1.0 + gate[j] * (1.0 - s));
		for (int64_t h = 0; h < H; h++)
			dw_down[j * H + h] += g * act[j] * dy[h];
	}
	for (int64_t h = 0; h < H; h++) {
		double d = 0.0;
		for (int64_t j = 0; j < F; j++) {
			dw_gate[h * F + j] += (double)row[h] * dpre_gate[j];
			dw_up[h * F + j] += (double)row[h] * dpre_up[j];
			d += dpre_gate[j] * x->gate[h * F + j] + dpre_up[j] * x->up[h * F + j];
		}
		dx[h] = d;
	}
	free(gate);
	return dg;
}

static struct rmoe_expert_shape expert_shape(int64_t H, int64_t F, int64_t ne, const int64_t *rows_per_expert)
{
	struct rmoe_expert_shape a = {.hidden = H, .ffn = F, .n_experts = ne, .rows_per_expert = rows_per_expert};
	for (int64_t e = 0; e < ne; e++)
		a.rows += rows_per_expert[e];
	return a;
}

/* ---- group set-up ------------------------------------------------------- */

/* RMOE_TEST_DEVICE=cuda runs every test on one CUDA worker and no CPU
 * worker (the gpu label): the CUDA codelets against the same double loops,
 * at the same tolerances. Without a CUDA worker that run is skipped (77). */
static int on_cuda;

static int group_setup(void **state)
{
	(void)state;
	const char *dev = getenv("RMOE_TEST_DEVICE");
	on_cuda = dev && strcmp(dev, "cuda") == 0;
	int ret = codelets_fixture_start(on_cuda);
	if (ret == -ENODEV && on_cuda) {
		fprintf(stderr, "test_codelets: RMOE_TEST_DEVICE=cuda but StarPU found no CUDA worker: skipped\n");
		exit(77);
	}
	if (ret != 0) {
		fprintf(stderr, "starpu_init: %d\n", ret);
		return -1;
	}
	return 0;
}

/* ---- router ------------------------------------------------------------- */

/* tie_pairs: columns 2j and 2j+1 of w_router equal, so every pair of experts
 * ties exactly and the order within the top-k shows the tie rule. */
static void check_router_fwd(uint64_t seed, int64_t T, int64_t H, int64_t E, int64_t K, int norm,
                             int tie_pairs)
{
	struct rng r = {seed};
	float *x = rng_floats(&r, T * H, 1.0);
	float *w_router = rng_floats(&r, H * E, 1.0 / sqrt((double)H));
	if (tie_pairs)
		for (int64_t h = 0; h < H; h++)
			for (int64_t e = 0; e + 1 < E; e += 2)
				w_router[h * E + e + 1] = w_router[h * E + e];
	float *probs = rng_floats(&r, T * E, 1.0);
	int32_t *idx = xcalloc(T * K, sizeof(int32_t));
	float *tw = rng_floats(&r, T * K, 1.0);

	starpu_data_handle_t h[5] = {vec_f(x, T * H), vec_f(w_router, H * E), vec_f(probs, T * E),
	                             vec_i(idx, T * K), vec_f(tw, T * K)};
	struct rmoe_router_shape a = {.tokens = T, .hidden = H, .experts = E, .topk = K, .norm_topk = norm};
	INSERT(rmoe_insert_router_fwd(opts("router-fwd"), &a, h[0], h[1], h[2], h[3], h[4]));
	wait_all();
	unregister_all(h, 5);

	double *ref_probs = xcalloc(T * E, sizeof(double));
	int32_t *ref_idx = xcalloc(T * K, sizeof(int32_t));
	double *ref_tw = xcalloc(T * K, sizeof(double));
	ref_route(x, w_router, T, H, E, K, norm, ref_probs, ref_idx, ref_tw);
	assert_rel_err(rel_err_d(probs, ref_probs, T * E), TOL_F32);
	assert_memory_equal(idx, ref_idx, (size_t)(T * K) * sizeof(int32_t));
	assert_rel_err(rel_err_d(tw, ref_tw, T * K), TOL_F32);
	int ties = 0;
	for (int64_t t = 0; t < T; t++) {
		double s = 0.0;
		for (int64_t k = 0; k < K; k++) {
			s += tw[t * K + k];
			if (k > 0) {
				assert_true(tw[t * K + k - 1] >= tw[t * K + k]);
				if (tw[t * K + k - 1] == tw[t * K + k]) {
					assert_true(idx[t * K + k - 1] < idx[t * K + k]);
					ties++;
				}
			}
		}
		if (norm)
			assert_true(fabs(s - 1.0) < 1e-5); /* fp32 sum of K terms */
	}
	if (tie_pairs)
		assert_true(ties >= T);

	free(x);
	free(w_router);
	free(probs);
	free(idx);
	free(tw);
	free(ref_probs);
	free(ref_idx);
	free(ref_tw);
}

static void test_codelets_router_fwd_renormalised(void **state)
{
	(void)state;
	check_router_fwd(11, 37, 24, 8, 3, 1, 0);
}

static void test_codelets_router_fwd_not_renormalised(void **state)
{
	(void)state;
	check_router_fwd(12, 37, 24, 8, 3, 0, 0);
}

static void test_codelets_router_fwd_k1_and_ke(void **state)
{
	(void)state;
	check_router_fwd(13, 29, 16, 6, 1, 1, 0);
	check_router_fwd(14, 29, 16, 6, 1, 0, 0);
	check_router_fwd(15, 29, 16, 6, 6, 1, 0);
	check_router_fwd(16, 29, 16, 6, 6, 0, 0);
}

static void test_codelets_router_fwd_ties_lower_expert_first(void **state)
{
	(void)state;
	check_router_fwd(17, 23, 16, 8, 3, 1, 1);
	check_router_fwd(18, 23, 16, 8, 8, 0, 1);
}

/* L = sum_{t,k} dg[t,k] * topk_w[t,k](x, w_router), the top-k choice held fixed. */
static double router_loss(const float *x, const float *w_router, int64_t T, int64_t H, int64_t E, int64_t K,
                          int norm, const int32_t *idx, const float *dg)
{
	double *p = xcalloc(E, sizeof(double)), *w = xcalloc(K, sizeof(double));
	double loss = 0.0;
	for (int64_t t = 0; t < T; t++) {
		ref_softmax(x + t * H, w_router, H, E, p);
		ref_topk_weights(p, idx + t * K, K, norm, w);
		for (int64_t k = 0; k < K; k++)
			loss += dg[t * K + k] * w[k];
	}
	free(p);
	free(w);
	return loss;
}

/* Central differences of router_loss in double, perturbing the fp32 inputs
 * through a double copy. */
static void router_fd(float *v, int64_t n, double *grad, const float *x, const float *w_router, int64_t T,
                      int64_t H, int64_t E, int64_t K, int norm, const int32_t *idx, const float *dg)
{
	const float step = 0x1.0p-10f;
	for (int64_t i = 0; i < n; i++) {
		/* The loss reads fp32 inputs: divide by the steps actually taken. */
		float saved = v[i], plus = saved + step, minus = saved - step;
		v[i] = plus;
		double lp = router_loss(x, w_router, T, H, E, K, norm, idx, dg);
		v[i] = minus;
		double lm = router_loss(x, w_router, T, H, E, K, norm, idx, dg);
		v[i] = saved;
		grad[i] = (lp - lm) / ((double)plus - (double)minus);
	}
}

static void check_router_bwd(uint64_t seed, int norm)
{
	const int64_t T = 7, H = 6, E = 5, K = 2;
	struct rng r = {seed};
	float *x = rng_floats(&r, T * H, 1.0);
	float *w_router = rng_floats(&r, H * E, 1.0);
	float *probs = rng_floats(&r, T * E, 1.0);
	int32_t *idx = xcalloc(T * K, sizeof(int32_t));
	float *tw = rng_floats(&r, T * K, 1.0);
	float *dg = rng_floats(&r, T * K, 1.0);
	float *dx = rng_floats(&r, T * H, 0.1);
	float *dx0 = xcalloc(T * H, sizeof(float));
	memcpy(dx0, dx, (size_t)(T * H) * sizeof(float));
	float *dw_router = rng_floats(&r, H * E, 1.0); /* overwritten */

	starpu_data_handle_t h[8] = {vec_f(x, T * H),  vec_f(w_router, H * E), vec_f(probs, T * E),
	                             vec_i(idx, T * K), vec_f(tw, T * K),       vec_f(dg, T * K),
	                             vec_f(dx, T * H),  vec_f(dw_router, H * E)};
	struct rmoe_router_shape a = {.tokens = T, .hidden = H, .experts = E, .topk = K, .norm_topk = norm};
	INSERT(rmoe_insert_router_fwd(opts("router-fwd"), &a, h[0], h[1], h[2], h[3], h[4]));
	INSERT(rmoe_insert_router_bwd(opts("router-bwd"), &a, h[0], h[1], h[2], h[3], h[4], h[5], NULL, h[6], h[7]));
	wait_all();
	unregister_all(h, 8);

	/* The codelet's choice is the reference's, so the fixed-choice loss is
	 * the one the codelet differentiated. */
	double *ref_probs = xcalloc(T * E, sizeof(double)), *ref_tw = xcalloc(T * K, sizeof(double));
	int32_t *ref_idx = xcalloc(T * K, sizeof(int32_t));
	ref_route(x, w_router, T, H, E, K, norm, ref_probs, ref_idx, ref_tw);
	assert_memory_equal(idx, ref_idx, (size_t)(T * K) * sizeof(int32_t));

	double *fd_w = xcalloc(H * E, sizeof(double)), *fd_x = xcalloc(T * H, sizeof(double));
	router_fd(w_router, H * E, fd_w, x, w_router, T, H, E, K, norm, idx, dg);
	router_fd(x, T * H, fd_x, x, w_router, T, H, E, K, norm, idx, dg);
	float *ddx = xcalloc(T * H, sizeof(float));
	for (int64_t i = 0; i < T * H; i++)
		ddx[i] = dx[i] - dx0[i];
	/* fp32 gradient; the central differences' O(step^2) error is below 1e-6. */
	assert_rel_err(rel_err_d(dw_router, fd_w, H * E), TOL_F32);
	assert_rel_err(rel_err_d(ddx, fd_x, T * H), TOL_F32);

	free(x);
	free(w_router);
	free(probs);
	free(idx);
	free(tw);
	free(dg);
	free(dx);
	free(dx0);
	free(dw_router);
	free(ref_probs);
	free(ref_tw);
	free(ref_idx);
	free(fd_w);
	free(fd_x);
	free(ddx);
}

static void test_codelets_router_bwd_matches_finite_differences(void **state)
{
	(void)state;
	check_router_bwd(21, 1);
	check_router_bwd(22, 0);
}

/* ---- dispatch map ------------------------------------------------------- */

static void check_dispatch_map(const int32_t *idx, int64_t T, int64_t K, int64_t E)
{
	int32_t *topk_idx = xcalloc(T * K, sizeof(int32_t));
	memcpy(topk_idx, idx, (size_t)(T * K) * sizeof(int32_t));
	int32_t *pair_order = xcalloc(T * K, sizeof(int32_t)), *counts = xcalloc(E, sizeof(int32_t));
	int32_t *ref_order = xcalloc(T * K, sizeof(int32_t)), *ref_counts = xcalloc(E, sizeof(int32_t));
	for (int64_t i = 0; i < T * K; i++)
		pair_order[i] = -7;
	for (int64_t e = 0; e < E; e++)
		counts[e] = -7;

	starpu_data_handle_t h[3] = {vec_i(topk_idx, T * K), vec_i(pair_order, T * K), vec_i(counts, E)};
	INSERT(rmoe_insert_dispatch_map(opts("dispatch-map"), T, K, E, h[0], h[1], h[2]));
	wait_all();
	unregister_all(h, 3);

	ref_dispatch(idx, T, K, E, ref_order, ref_counts);
	assert_memory_equal(pair_order, ref_order, (size_t)(T * K) * sizeof(int32_t));
	assert_memory_equal(counts, ref_counts, (size_t)E * sizeof(int32_t));
	free(topk_idx);
	free(pair_order);
	free(counts);
	free(ref_order);
	free(ref_counts);
}

static void test_codelets_dispatch_map_uneven_with_empty_experts(void **state)
{
	(void)state;
	const int64_t T = 41, K = 2, E = 8;
	const int allowed[8] = {1, 1, 1, 0, 0, 1, 0, 0};
	struct rng r = {31};
	int32_t *idx = xcalloc(T * K, sizeof(int32_t));
	random_routing(&r, T, K, E, allowed, 1, idx);
	check_dispatch_map(idx, T, K, E);
	free(idx);
}

static void test_codelets_dispatch_map_all_to_one_expert(void **state)
{
	(void)state;
	const int64_t T = 19, K = 1, E = 6;
	int32_t *idx = xcalloc(T * K, sizeof(int32_t));
	for (int64_t p = 0; p < T * K; p++)
		idx[p] = 4;
	check_dispatch_map(idx, T, K, E);
	free(idx);
}

static void test_codelets_dispatch_map_k_equals_e(void **state)
{
	(void)state;
	const int64_t T = 13, K = 5, E = 5;
	struct rng r = {32};
	int32_t *idx = xcalloc(T * K, sizeof(int32_t));
	random_routing(&r, T, K, E, NULL, 0, idx);
	check_dispatch_map(idx, T, K, E);
	free(idx);
}

/* ---- gather / scatter-add ---------------------------------------------- */

/* A routing and its pair order, with the slice of experts [e0, e1). */
struct slice_case {
	int64_t T, K, E, H;
	int32_t *idx, *pair_order, *counts;
	float *topk_w;
	int64_t first, count;
};

static void slice_case_init(struct slice_case *c, struct rng *r, int64_t T, int64_t K, int64_t E, int64_t H,
                            int64_t e0, int64_t e1, const int *allowed, int skew)
{
	c->T = T;
	c->K = K;
	c->E = E;
	c->H = H;
	c->idx = xcalloc(T * K, sizeof(int32_t));
	c->pair_order = xcalloc(T * K, sizeof(int32_t));
	c->counts = xcalloc(E, sizeof(int32_t));
	c->topk_w = rng_floats(r, T * K, 1.0);
	random_routing(r, T, K, E, allowed, skew, c->idx);
	ref_dispatch(c->idx, T, K, E, c->pair_order, c->counts);
	c->first = c->count = 0;
	for (int64_t e = 0; e < e1; e++) {
		if (e < e0)
			c->first += c->counts[e];
		else
			c->count += c->counts[e];
	}
}

static void slice_case_free(struct slice_case *c)
{
	free(c->idx);
	free(c->pair_order);
	free(c->counts);
	free(c->topk_w);
}

static void check_gather(int weighted)
{
	struct rng r = {41 + (uint64_t)weighted};
	struct slice_case c;
	slice_case_init(&c, &r, 17, 3, 6, 10, 2, 4, NULL, 1);
	const int64_t T = c.T, H = c.H, P = c.T * c.K;
	assert_true(c.count > 0);
	float *src = rng_floats(&r, T * H, 1.0);
	float *rows = rng_floats(&r, c.count * H, 1.0);

	starpu_data_handle_t h[4] = {vec_f(src, T * H), vec_i(c.pair_order, P), vec_f(rows, c.count * H),
	                             vec_f(c.topk_w, P)};
	struct rmoe_pair_slice a = {.first = c.first, .count = c.count, .hidden = H, .topk = c.K};
	INSERT(rmoe_insert_gather(opts("gather"), &a, h[0], h[1], weighted ? h[3] : NULL, h[2]));
	wait_all();
	unregister_all(h, 4);

	double *ref = xcalloc(c.count * H, sizeof(double));
	for (int64_t i = 0; i < c.count; i++) {
		int64_t p = c.pair_order[c.first + i];
		for (int64_t j = 0; j < H; j++)
			ref[i * H + j] = (weighted ? (double)c.topk_w[p] : 1.0) * src[(p / c.K) * H + j];
	}
	assert_rel_err(rel_err_d(rows, ref, c.count * H), weighted ? TOL_ONE_OP : 0.0);
	free(src);
	free(rows);
	free(ref);
	slice_case_free(&c);
}

static void test_codelets_gather_rows_of_a_slice(void **state)
{
	(void)state;
	check_gather(0);
	check_gather(1);
}

static void check_scatter_add(int weighted)
{
	struct rng r = {51 + (uint64_t)weighted};
	struct slice_case c;
	slice_case_init(&c, &r, 17, 3, 6, 10, 1, 5, NULL, 1);
	const int64_t T = c.T, H = c.H, P = c.T * c.K;
	float *rows = rng_floats(&r, c.count * H, 1.0);
	float *dst = rng_floats(&r, T * H, 1.0);
	double *ref = xcalloc(T * H, sizeof(double));
	for (int64_t i = 0; i < T * H; i++)
		ref[i] = dst[i];
	for (int64_t i = 0; i < c.count; i++) {
		int64_t p = c.pair_order[c.first + i];
		for (int64_t j = 0; j < H; j++)
			ref[(p / c.K) * H + j] += (weighted ? (double)c.topk_w[p] : 1.0) * rows[i * H + j];
	}

	starpu_data_handle_t h[4] = {vec_f(rows, c.count * H), vec_i(c.pair_order, P), vec_f(dst, T * H),
	                             vec_f(c.topk_w, P)};
	struct rmoe_pair_slice a = {.first = c.first, .count = c.count, .hidden = H, .topk = c.K};
	INSERT(rmoe_insert_scatter_add(opts("scatter-add"), &a, h[0], h[1], weighted ? h[3] : NULL, h[2]));
	wait_all();
	unregister_all(h, 4);
	/* Up to K fp32 additions per element. */
	assert_rel_err(rel_err_d(dst, ref, T * H), TOL_ONE_OP);
	free(rows);
	free(dst);
	free(ref);
	slice_case_free(&c);
}

static void test_codelets_scatter_add_into_tokens(void **state)
{
	(void)state;
	check_scatter_add(0);
	check_scatter_add(1);
}

/* ---- expert FFN and recompute ----------------------------------------- */

static void check_expert_ffn(uint64_t seed, int64_t ne, const int64_t *rows_per_expert)
{
	const int64_t H = 12, F = 10;
	struct rng r = {seed};
	struct rmoe_expert_shape a = expert_shape(H, F, ne, rows_per_expert);
	const int64_t m = a.rows;
	float *x = rng_floats(&r, m * H, 1.0);
	float *w = rng_floats(&r, 3 * ne * H * F, 1.0 / sqrt((double)H));
	float *work = rng_floats(&r, 3 * m * F, 1.0);
	float *out = rng_floats(&r, m * H, 1.0);
	float *work4 = rng_floats(&r, 4 * m * F, 1.0);
	float *work3 = rng_floats(&r, 3 * m * F, 1.0);

	starpu_data_handle_t h[6] = {vec_f(x, m * H),   vec_f(w, 3 * ne * H * F), vec_f(work, 3 * m * F),
	                             vec_f(out, m * H), vec_f(work4, 4 * m * F),  vec_f(work3, 3 * m * F)};
	INSERT(rmoe_insert_expert_ffn(opts("expert-ffn"), &a, h[0], h[1], h[2], h[3]));
	/* §3.3 recompute, into a forward workspace and a pair-weighted backward one. */
	INSERT(rmoe_insert_expert_ffn(opts("recompute"), &a, h[0], h[1], h[4], NULL));
	INSERT(rmoe_insert_expert_ffn(opts("recompute"), &a, h[0], h[1], h[5], NULL));
	wait_all();
	unregister_all(h, 6);

	double *ref_work = xcalloc(3 * m * F, sizeof(double)), *ref_out = xcalloc(m * H, sizeof(double));
	int64_t o = 0;
	for (int64_t e = 0; e < ne; e++) {
		struct ref_expert ex = ref_expert_of(w, ne, H, F, e);
		for (int64_t i = o; i < o + rows_per_expert[e]; i++)
			ref_expert_fwd(&ex, x + i * H, ref_work + i * F, ref_work + (m + i) * F,
			               ref_work + (2 * m + i) * F, ref_out + i * H);
		o += rows_per_expert[e];
	}
	assert_rel_err(rel_err_d(work, ref_work, 3 * m * F), TOL_F32);
	assert_rel_err(rel_err_d(out, ref_out, m * H), TOL_F32);
	assert_rel_err(rel_err_d(work4, ref_work, 3 * m * F), TOL_F32);
	assert_rel_err(rel_err_d(work3, ref_work, 3 * m * F), TOL_F32);

	free(x);
	free(w);
	free(work);
	free(out);
	free(work4);
	free(work3);
	free(ref_work);
	free(ref_out);
}

static void test_codelets_expert_ffn_grouped_uneven(void **state)
{
	(void)state;
	const int64_t uneven[4] = {5, 0, 9, 3};
	check_expert_ffn(61, 4, uneven);
}

static void test_codelets_expert_ffn_all_rows_one_expert(void **state)
{
	(void)state;
	const int64_t one[3] = {0, 14, 0};
	check_expert_ffn(62, 3, one);
}

/* ---- bf16 -------------------------------------------------------------------- */

/* bf16 keeps 8 significant bits: round to nearest, ties to even. */
static void test_codelets_bf16_rounding_to_nearest_even(void **state)
{
	(void)state;
	const float cases[][2] = {
		{1.0f, 1.0f},
		{1.0f + 0x1p-8f, 1.0f},                  /* half-way, to the even 1.0 */
		{1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f},     /* half-way, to the even 1 + 2^-6 */
		{1.0f + 0x1p-8f + 0x1p-20f, 1.0f + 0x1p-7f}, /* just above half-way */
		{-2.5f, -2.5f},
		{0x1.fffffep127f, INFINITY},              /* above bf16's largest finite, 0x1.fep127 */
		{INFINITY, INFINITY},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		float v = cases[i][0];
		rmoe_round_to_dtype(&v, 1, RMOE_DTYPE_BF16);
		if (v != cases[i][1])
			fail_msg("bf16(%a) = %a, expected %a", (double)cases[i][0], (double)v, (double)cases[i][1]);
	}
	float nan = NAN, same = 0.1f;
	rmoe_round_to_dtype(&nan, 1, RMOE_DTYPE_BF16);
	assert_true(isnan(nan));
	rmoe_round_to_dtype(&same, 1, RMOE_DTYPE_F32);
	assert_true(same == 0.1f);
}

/* A bf16 buffer reaches a CPU kernel as an fp32 copy and what the kernel
 * writes is rounded back: the expert FFN on bf16 rows and weights gives the
 * fp32 FFN of the bf16 values, rounded once more on output (relative norm
 * error a few units of 2^-9), and leaves its inputs untouched. */
static void test_codelets_bf16_operands_in_fp32_copies(void **state)
{
	(void)state;
	const int64_t H = 16, F = 8, ne = 2, rows_per_expert[2] = {5, 7}, m = 12;
	struct rng r = {63};
	float *x = rng_floats(&r, m * H, 1.0), *w = rng_floats(&r, 3 * ne * H * F, 1.0 / sqrt((double)H));
	rmoe_round_to_dtype(x, m * H, RMOE_DTYPE_BF16);
	rmoe_round_to_dtype(w, 3 * ne * H * F, RMOE_DTYPE_BF16);
	uint16_t *xb = xcalloc(m * H, 2), *wb = xcalloc(3 * ne * H * F, 2), *outb = xcalloc(m * H, 2);
	uint16_t *workb = xcalloc(3 * m * F, 2);
	rmoe_to_elements(x, xb, m * H, 2);
	rmoe_to_elements(w, wb, 3 * ne * H * F, 2);
	float *work = xcalloc(3 * m * F, sizeof(float)), *out = xcalloc(m * H, sizeof(float));
	starpu_data_handle_t h[8];
	starpu_vector_data_register(&h[0], STARPU_MAIN_RAM, (uintptr_t)xb, (uint32_t)(m * H), 2);
	starpu_vector_data_register(&h[1], STARPU_MAIN_RAM, (uintptr_t)wb, (uint32_t)(3 * ne * H * F), 2);
	starpu_vector_data_register(&h[2], STARPU_MAIN_RAM, (uintptr_t)workb, (uint32_t)(3 * m * F), 2);
	starpu_vector_data_register(&h[3], STARPU_MAIN_RAM, (uintptr_t)outb, (uint32_t)(m * H), 2);
	h[4] = vec_f(x, m * H);
	h[5] = vec_f(w, 3 * ne * H * F);
	h[6] = vec_f(work, 3 * m * F);
	h[7] = vec_f(out, m * H);
	struct rmoe_expert_shape a = expert_shape(H, F, ne, rows_per_expert);
	INSERT(rmoe_insert_expert_ffn(opts("expert-ffn"), &a, h[0], h[1], h[2], h[3]));
	INSERT(rmoe_insert_expert_ffn(opts("expert-ffn"), &a, h[4], h[5], h[6], h[7]));
	wait_all();
	unregister_all(h, 8);
	float *got = xcalloc(m * H, sizeof(float)), *x_back = xcalloc(m * H, sizeof(float));
	rmoe_from_elements(outb, got, m * H, 2);
	rmoe_from_elements(xb, x_back, m * H, 2);
	assert_memory_equal(x_back, x, (size_t)(m * H) * sizeof(float));
	/* The fp32 run saw the same values; only the bf16 stores differ. */
	assert_rel_err(rel_err_f(got, out, m * H), 2e-2);
	assert_true(rel_err_f(got, out, m * H) > 0);
	void *all[] = {x, w, xb, wb, outb, workb, work, out, got, x_back};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		free(all[i]);
}

/* ---- expert backward ---------------------------------------------------- */

/* The local pairs of one partition (experts [e0, e0 + ne) of E), their
 * gathered rows, and the reference gradients. */
struct bwd_case {
	struct slice_case s;
	int64_t e0, ne, F, m;
	int64_t *rows_per_expert;
	float *w, *x, *dy;         /* partition weights, token x and dy [T*H] */
	float *x_rows, *dy_rows, *dout_rows; /* [m*H] gathered; dout = g*dy */
	double *ref_dx, *ref_dg, *ref_dw; /* [m*H], [T*K] (slice pairs), [3*ne*H*F] */
};

static void bwd_case_init(struct bwd_case *c, uint64_t seed)
{
	const int64_t T = 15, K = 3, E = 8, H = 12, F = 10;
	/* Expert 5 receives no token: its gradients must be zero. */
	const int allowed[8] = {1, 1, 1, 1, 1, 0, 1, 1};
	struct rng r = {seed};
	c->e0 = 4;
	c->ne = 4;
	c->F = F;
	slice_case_init(&c->s, &r, T, K, E, H, c->e0, c->e0 + c->ne, allowed, 0);
	c->m = c->s.count;
	c->rows_per_expert = xcalloc(c->ne, sizeof(int64_t));
	for (int64_t e = 0; e < c->ne; e++)
		c->rows_per_expert[e] = c->s.counts[c->e0 + e];
	assert_int_equal(c->rows_per_expert[1], 0);
	c->w = rng_floats(&r, 3 * c->ne * H * F, 1.0 / sqrt((double)H));
	c->x = rng_floats(&r, T * H, 1.0);
	c->dy = rng_floats(&r, T * H, 1.0);
	c->x_rows = xcalloc(c->m * H, sizeof(float));
	c->dy_rows = xcalloc(c->m * H, sizeof(float));
	c->dout_rows = xcalloc(c->m * H, sizeof(float));
	c->ref_dx = xcalloc(c->m * H, sizeof(double));
	c->ref_dg = xcalloc(T * K, sizeof(double));
	c->ref_dw = xcalloc(3 * c->ne * H * F, sizeof(double));
	int64_t o = 0;
	for (int64_t e = 0; e < c->ne; e++) {
		struct ref_expert ex = ref_expert_of(c->w, c->ne, H, F, e);
		double *dw_gate = c->ref_dw + e * H * F, *dw_up = c->ref_dw + (c->ne + e) * H * F;
		double *dw_down = c->ref_dw + (2 * c->ne + e) * H * F;
		for (int64_t i = o; i < o + c->rows_per_expert[e]; i++) {
			int64_t p = c->s.pair_order[c->s.first + i], t = p / K;
			float g = c->s.topk_w[p];
			memcpy(c->x_rows + i * H, c->x + t * H, (size_t)H * sizeof(float));
			memcpy(c->dy_rows + i * H, c->dy + t * H, (size_t)H * sizeof(float));
			for (int64_t j = 0; j < H; j++)
				c->dout_rows[i * H + j] = g * c->dy[t * H + j];
			c->ref_dg[p] = ref_expert_bwd(&ex, c->x + t * H, c->dy + t * H, g, c->ref_dx + i * H,
			                              dw_gate, dw_up, dw_down);
		}
		o += c->rows_per_expert[e];
	}
}

static void bwd_case_free(struct bwd_case *c)
{
	slice_case_free(&c->s);
	free(c->rows_per_expert);
	free(c->w);
	free(c->x);
	free(c->dy);
	free(c->x_rows);
	free(c->dy_rows);
	free(c->dout_rows);
	free(c->ref_dx);
	free(c->ref_dg);
	free(c->ref_dw);
}

/* One expert_bwd task for rows [r0, r1) of the slice: its workspace
 * recomputed (pair-weighted) or saved by a forward (preweighted), the graph's
 * way. */
/* Pair-weighted: x_rows is consumed (the task leaves the rows' dx there) and
 * dx is the [T*H] accumulator; pair rows: the same without the accumulator
 * (h_dx_acc NULL), the result being x_rows; preweighted: dx_rows receives
 * the rows' dx. */
static void submit_expert_bwd_chunk(const struct bwd_case *c, int mode, int64_t r0, int64_t r1,
                                    int accumulate, starpu_data_handle_t h_w,
                                    starpu_data_handle_t h_pairs, starpu_data_handle_t h_topk_w,
                                    starpu_data_handle_t h_dg, starpu_data_handle_t h_dw, float *x_rows,
                                    starpu_data_handle_t h_dx_acc, float *dx_rows)
{
	const int64_t H = c->s.H, F = c->F, n = r1 - r0;
	int64_t *chunk_rows = xcalloc(c->ne, sizeof(int64_t));
	int64_t o = 0;
	for (int64_t e = 0; e < c->ne; e++) {
		int64_t end = o + c->rows_per_expert[e];
		int64_t lo = o > r0 ? o : r0, hi = end < r1 ? end : r1;
		chunk_rows[e] = hi > lo ? hi - lo : 0;
		o += c->rows_per_expert[e];
	}
	struct rmoe_expert_shape a = expert_shape(H, F, c->ne, chunk_rows);
	assert_int_equal(a.rows, n);

	starpu_data_handle_t h_x = vec_f(x_rows + r0 * H, n * H);
	starpu_data_handle_t h_dx = NULL;
	if (mode != PREWEIGHTED) {
		starpu_data_handle_t h_dy = vec_f(c->dy_rows + r0 * H, n * H);
		starpu_data_handle_t h_work = vec_tmp(4 * n * F);
		INSERT(rmoe_insert_expert_ffn(opts("recompute"), &a, h_x, h_w, h_work, NULL));
		INSERT(rmoe_insert_expert_bwd_pairs(opts("expert-bwd"), &a, c->s.first + r0, c->s.K, accumulate, h_x,
		                                    h_dy, h_w, h_pairs, h_topk_w, h_work, h_dx_acc, h_dg, h_dw));
		starpu_data_unregister_submit(h_work);
		starpu_data_unregister_submit(h_dy);
	} else {
		h_dx = vec_f(dx_rows + r0 * H, n * H);
		starpu_data_handle_t h_dout = vec_f(c->dout_rows + r0 * H, n * H);
		starpu_data_handle_t h_work = vec_tmp(3 * n * F), h_out = vec_tmp(n * H);
		INSERT(rmoe_insert_expert_ffn(opts("expert-ffn"), &a, h_x, h_w, h_work, h_out));
		starpu_data_unregister_submit(h_out);
		INSERT(rmoe_insert_expert_bwd_preweighted(opts("expert-bwd"), &a, accumulate, h_x, h_dout, h_w, h_work,
		                                          h_dx, h_dw));
		starpu_data_unregister_submit(h_work);
		starpu_data_unregister_submit(h_dout);
	}
	starpu_data_unregister_submit(h_x);
	if (h_dx)
		starpu_data_unregister_submit(h_dx);
	free(chunk_rows);
}

/* The whole slice as one chunk (split = 0) or two, the second accumulating.
 * dx: the rows' dx (preweighted and pair rows, m*H) or the [T*H]
 * accumulator they are added into (pair-weighted). */
static void run_expert_bwd(const struct bwd_case *c, int mode, int64_t split, float *dx, float *dg,
                           float *dw)
{
	const int64_t P = c->s.T * c->s.K, nw = 3 * c->ne * c->s.H * c->F, H = c->s.H;
	starpu_data_handle_t h[6] = {vec_f(c->w, nw), vec_i(c->s.pair_order, P), vec_f(c->s.topk_w, P),
	                             vec_f(dg, P), vec_f(dw, nw), NULL};
	/* The pair-weighted task consumes its x rows: give it a copy. */
	float *x_rows = xcalloc(c->m * H, sizeof(float));
	memcpy(x_rows, c->x_rows, (size_t)(c->m * H) * sizeof(float));
	if (mode == PAIR_WEIGHTED)
		h[5] = vec_f(dx, c->s.T * H);
	if (split == 0) {
		submit_expert_bwd_chunk(c, mode, 0, c->m, 0, h[0], h[1], h[2], h[3], h[4], x_rows, h[5], dx);
	} else {
		submit_expert_bwd_chunk(c, mode, 0, split, 0, h[0], h[1], h[2], h[3], h[4], x_rows, h[5], dx);
		submit_expert_bwd_chunk(c, mode, split, c->m, 1, h[0], h[1], h[2], h[3], h[4], x_rows, h[5],
		                        dx);
	}
	wait_all();
	unregister_all(h, mode == PAIR_WEIGHTED ? 6 : 5);
	/* Pair rows: the consumed x rows are the result. */
	if (mode == PAIR_ROWS)
		memcpy(dx, x_rows, (size_t)(c->m * H) * sizeof(float));
	free(x_rows);
}

static void check_expert_bwd(int mode)
{
	struct bwd_case c;
	bwd_case_init(&c, 71 + (uint64_t)mode);
	const int64_t H = c.s.H, F = c.F, P = c.s.T * c.s.K, nw = 3 * c.ne * H * F;
	struct rng r = {81};
	float *dg_init = rng_floats(&r, P, 1.0);

	/* Garbage in the W outputs: an expert with no rows must come out zero.
	 * Pair-weighted adds each row's dx at its token into a [T*H]
	 * accumulator that starts from seeded values. */
	const int pw = mode == PAIR_WEIGHTED;
	const int64_t ndx = pw ? c.s.T * H : c.m * H;
	float *dx_init = rng_floats(&r, ndx, 1.0);
	double *want_dx = xcalloc(ndx, sizeof(double));
	if (pw) {
		for (int64_t i = 0; i < ndx; i++)
			want_dx[i] = dx_init[i];
		for (int64_t i = 0; i < c.m; i++) {
			int64_t t = c.s.pair_order[c.s.first + i] / c.s.K;
			for (int64_t j = 0; j < H; j++)
				want_dx[t * H + j] += c.ref_dx[i * H + j];
		}
	} else {
		memcpy(want_dx, c.ref_dx, (size_t)ndx * sizeof(double));
	}
	float *dx1 = xcalloc(ndx, sizeof(float)), *dg1 = xcalloc(P, sizeof(float));
	float *dw1 = rng_floats(&r, nw, 1.0);
	memcpy(dx1, dx_init, (size_t)ndx * sizeof(float));
	memcpy(dg1, dg_init, (size_t)P * sizeof(float));
	run_expert_bwd(&c, mode, 0, dx1, dg1, dw1);

	assert_rel_err(rel_err_d(dx1, want_dx, ndx), TOL_F32);
	assert_rel_err(rel_err_d(dw1, c.ref_dw, nw), TOL_F32);
	for (int64_t e = 0; e < c.ne; e++)
		if (c.rows_per_expert[e] == 0)
			for (int64_t part = 0; part < 3; part++)
				for (int64_t i = 0; i < H * F; i++)
					assert_true(dw1[(part * c.ne + e) * H * F + i] == 0.0f);
	if (mode != PREWEIGHTED) {
		/* The slice's pairs written, every other pair untouched. */
		int64_t n_slice = 0;
		double num = 0.0, den = 0.0;
		for (int64_t p = 0; p < P; p++) {
			int in_slice = 0;
			for (int64_t i = 0; i < c.m; i++)
				in_slice |= c.s.pair_order[c.s.first + i] == p;
			if (in_slice) {
				num += (dg1[p] - c.ref_dg[p]) * (dg1[p] - c.ref_dg[p]);
				den += c.ref_dg[p] * c.ref_dg[p];
				n_slice++;
			} else {
				assert_true(dg1[p] == dg_init[p]);
			}
		}
		assert_int_equal(n_slice, c.m);
		assert_rel_err(sqrt(num / den), TOL_F32);
	} else {
		assert_memory_equal(dg1, dg_init, (size_t)P * sizeof(float));
	}

	/* Two chunks, split inside an expert's rows, the second accumulating:
	 * the same as one chunk. */
	float *dx2 = xcalloc(ndx, sizeof(float)), *dg2 = xcalloc(P, sizeof(float));
	float *dw2 = rng_floats(&r, nw, 1.0);
	memcpy(dx2, dx_init, (size_t)ndx * sizeof(float));
	memcpy(dg2, dg_init, (size_t)P * sizeof(float));
	int64_t split = c.rows_per_expert[0] + c.rows_per_expert[1] + c.rows_per_expert[2] / 2;
	assert_true(split > 0 && split < c.m);
	run_expert_bwd(&c, mode, split, dx2, dg2, dw2);
	assert_rel_err(rel_err_f(dw2, dw1, nw), TOL_F32);
	assert_rel_err(rel_err_d(dw2, c.ref_dw, nw), TOL_F32);
	assert_rel_err(rel_err_f(dx2, dx1, ndx), TOL_F32);
	assert_rel_err(rel_err_f(dg2, dg1, P), TOL_F32);

	free(dg_init);
	free(dx_init);
	free(want_dx);
	free(dx1);
	free(dg1);
	free(dw1);
	free(dx2);
	free(dg2);
	free(dw2);
	bwd_case_free(&c);
}

static void test_codelets_expert_bwd_pair_weighted(void **state)
{
	(void)state;
	check_expert_bwd(PAIR_WEIGHTED);
}

static void test_codelets_expert_bwd_pair_rows(void **state)
{
	(void)state;
	check_expert_bwd(PAIR_ROWS);
}

static void test_codelets_expert_bwd_preweighted(void **state)
{
	(void)state;
	check_expert_bwd(PREWEIGHTED);
}

/* ---- accumulate and zero ------------------------------------------------ */

static void test_codelets_accumulate_and_zero(void **state)
{
	(void)state;
	const int64_t n = 1000;
	struct rng r = {91};
	float *src = rng_floats(&r, n, 1.0), *dst = rng_floats(&r, n, 1.0);
	float *zeroed = rng_floats(&r, n, 1.0);
	double *ref = xcalloc(n, sizeof(double));
	for (int64_t i = 0; i < n; i++)
		ref[i] = (double)dst[i] + src[i];
	starpu_data_handle_t h[3] = {vec_f(src, n), vec_f(dst, n), vec_f(zeroed, n)};
	INSERT(rmoe_insert_accumulate(opts("grad-accumulate"), n, h[0], h[1]));
	INSERT(rmoe_insert_zero(opts("zero"), n, h[2]));
	wait_all();
	unregister_all(h, 3);
	assert_rel_err(rel_err_d(dst, ref, n), TOL_ONE_OP);
	for (int64_t i = 0; i < n; i++)
		assert_true(zeroed[i] == 0.0f);
	free(src);
	free(dst);
	free(zeroed);
	free(ref);
}

/* ---- sort_chunks --------------------------------------------------------- */

static void check_sort_chunks(uint64_t seed, int64_t n_peers, int64_t ne, const int64_t *counts)
{
	const int64_t H = 5;
	struct rng r = {seed};
	float **peer = xcalloc(n_peers, sizeof(float *)), **back = xcalloc(n_peers, sizeof(float *));
	int64_t *peer_rows = xcalloc(n_peers, sizeof(int64_t));
	int64_t total = 0, n_active = 0;
	for (int64_t q = 0; q < n_peers; q++) {
		for (int64_t e = 0; e < ne; e++)
			peer_rows[q] += counts[q * ne + e];
		total += peer_rows[q];
		if (peer_rows[q]) {
			peer[q] = rng_floats(&r, peer_rows[q] * H, 1.0);
			back[q] = rng_floats(&r, peer_rows[q] * H, 1.0);
			n_active++;
		}
	}
	assert_true(n_active < n_peers); /* a peer with no rows, hence no buffer */
	float *sorted = rng_floats(&r, total * H, 1.0);

	/* One handle per peer with rows, NULL for the others. */
	starpu_data_handle_t *h_peer = xcalloc(n_peers, sizeof(*h_peer));
	starpu_data_handle_t *h_back = xcalloc(n_peers, sizeof(*h_back));
	starpu_data_handle_t h_sorted = vec_f(sorted, total * H);
	int64_t k = 0;
	for (int64_t q = 0; q < n_peers; q++)
		if (peer_rows[q]) {
			h_peer[q] = vec_f(peer[q], peer_rows[q] * H);
			h_back[q] = vec_f(back[q], peer_rows[q] * H);
			k++;
		}
	assert_int_equal(k, n_active);
	INSERT(rmoe_insert_sort_chunks(opts("sort-by-expert"), RMOE_SORT_BY_EXPERT, H, n_peers, ne, counts, h_peer,
	                               h_sorted));
	INSERT(rmoe_insert_sort_chunks(opts("unsort"), RMOE_UNSORT_TO_PEERS, H, n_peers, ne, counts, h_back,
	                               h_sorted));
	wait_all();
	starpu_data_unregister(h_sorted);
	for (int64_t q = 0; q < n_peers; q++)
		if (peer_rows[q]) {
			starpu_data_unregister(h_peer[q]);
			starpu_data_unregister(h_back[q]);
		}

	/* Sorted order (e, q). */
	int64_t at = 0;
	for (int64_t e = 0; e < ne; e++)
		for (int64_t q = 0; q < n_peers; q++) {
			int64_t before = 0;
			for (int64_t f = 0; f < e; f++)
				before += counts[q * ne + f];
			for (int64_t i = 0; i < counts[q * ne + e]; i++, at++)
				assert_memory_equal(sorted + at * H, peer[q] + (before + i) * H,
				                    (size_t)H * sizeof(float));
		}
	assert_int_equal(at, total);
	/* Unsort after sort is the identity. */
	for (int64_t q = 0; q < n_peers; q++)
		if (peer_rows[q])
			assert_memory_equal(back[q], peer[q], (size_t)(peer_rows[q] * H) * sizeof(float));

	for (int64_t q = 0; q < n_peers; q++) {
		free(peer[q]);
		free(back[q]);
	}
	free(peer);
	free(back);
	free(peer_rows);
	free(sorted);
	free(h_peer);
	free(h_back);
}

static void test_codelets_sort_chunks_round_trip(void **state)
{
	(void)state;
	/* Peer 2 has no rows; chunk (1, 2) and (3, 0) are empty. */
	const int64_t counts4[4 * 3] = {2, 0, 3, 1, 4, 0, 0, 0, 0, 0, 2, 1};
	check_sort_chunks(101, 4, 3, counts4);
	/* Ten peers with rows and one without: eleven buffers, beyond STARPU_NMAXBUFS. */
	int64_t counts11[11 * 2];
	struct rng r = {102};
	for (int64_t i = 0; i < 11 * 2; i++)
		counts11[i] = 1 + rng_below(&r, 3);
	counts11[6 * 2] = counts11[6 * 2 + 1] = 0;
	check_sort_chunks(103, 11, 2, counts11);
}

/* ---- unpermute backward ------------------------------------------------- */

static void test_codelets_unpermute_bwd(void **state)
{
	(void)state;
	struct rng r = {111};
	struct slice_case c;
	slice_case_init(&c, &r, 14, 2, 6, 8, 2, 5, NULL, 1);
	const int64_t T = c.T, H = c.H, P = T * c.K;
	float *dy = rng_floats(&r, T * H, 1.0), *back = rng_floats(&r, c.count * H, 1.0);
	float *dout = rng_floats(&r, c.count * H, 1.0), *dg = rng_floats(&r, P, 1.0);
	float *dg_init = xcalloc(P, sizeof(float));
	memcpy(dg_init, dg, (size_t)P * sizeof(float));

	starpu_data_handle_t h[6] = {vec_f(dy, T * H),  vec_f(back, c.count * H), vec_i(c.pair_order, P),
	                             vec_f(c.topk_w, P), vec_f(dout, c.count * H), vec_f(dg, P)};
	struct rmoe_pair_slice a = {.first = c.first, .count = c.count, .hidden = H, .topk = c.K};
	INSERT(rmoe_insert_unpermute_bwd(opts("unpermute-bwd"), &a, h[0], h[1], h[2], h[3], h[4], h[5]));
	wait_all();
	unregister_all(h, 6);

	double *ref_dout = xcalloc(c.count * H, sizeof(double));
	double *ref_dg = xcalloc(c.count, sizeof(double));
	float *dg_slice = xcalloc(c.count, sizeof(float));
	for (int64_t i = 0; i < c.count; i++) {
		int64_t p = c.pair_order[c.first + i], t = p / c.K;
		for (int64_t j = 0; j < H; j++) {
			ref_dout[i * H + j] = (double)c.topk_w[p] * dy[t * H + j];
			ref_dg[i] += (double)dy[t * H + j] * back[i * H + j];
		}
		dg_slice[i] = dg[p];
		dg[p] = dg_init[p];
	}
	assert_rel_err(rel_err_d(dout, ref_dout, c.count * H), TOL_ONE_OP);
	assert_rel_err(rel_err_d(dg_slice, ref_dg, c.count), TOL_F32);
	assert_memory_equal(dg, dg_init, (size_t)P * sizeof(float)); /* other pairs untouched */

	free(dy);
	free(back);
	free(dout);
	free(dg);
	free(dg_init);
	free(ref_dout);
	free(ref_dg);
	free(dg_slice);
	slice_case_free(&c);
}

/* ---- the composed single-rank forward ----------------------------------- */

/* router_fwd -> dispatch_map -> per partition: gather -> expert_ffn ->
 * weighted scatter_add, the way one rank runs its own partition's hop,
 * against y[t] = sum_k g_k expert_{i_k}(x[t]) computed token by token. */
static void test_codelets_single_rank_pipeline(void **state)
{
	(void)state;
	const int64_t T = 24, H = 16, F = 12, E = 8, K = 2, n_parts = 4, ne = E / n_parts;
	struct rng r = {121};
	float *x = rng_floats(&r, T * H, 1.0);
	float *w_router = rng_floats(&r, H * E, 1.0 / sqrt((double)H));
	float *parts[4];
	for (int64_t j = 0; j < n_parts; j++)
		parts[j] = rng_floats(&r, 3 * ne * H * F, 1.0 / sqrt((double)H));
	float *y = rng_floats(&r, T * H, 1.0);

	starpu_data_handle_t h_x = vec_f(x, T * H), h_wr = vec_f(w_router, H * E), h_y = vec_f(y, T * H);
	starpu_data_handle_t h_probs = vec_tmp(T * E), h_tw = vec_tmp(T * K);
	starpu_data_handle_t h_idx, h_pairs, h_counts;
	starpu_vector_data_register(&h_idx, -1, 0, (uint32_t)(T * K), sizeof(int32_t));
	starpu_vector_data_register(&h_pairs, -1, 0, (uint32_t)(T * K), sizeof(int32_t));
	starpu_vector_data_register(&h_counts, -1, 0, (uint32_t)E, sizeof(int32_t));
	starpu_data_handle_t h_parts[4];
	for (int64_t j = 0; j < n_parts; j++)
		h_parts[j] = vec_f(parts[j], 3 * ne * H * F);

	struct rmoe_router_shape ra = {.tokens = T, .hidden = H, .experts = E, .topk = K, .norm_topk = 1};
	INSERT(rmoe_insert_router_fwd(opts("router-fwd"), &ra, h_x, h_wr, h_probs, h_idx, h_tw));
	starpu_data_unregister_submit(h_probs);
	INSERT(rmoe_insert_dispatch_map(opts("dispatch-map"), T, K, E, h_idx, h_pairs, h_counts));
	INSERT(rmoe_insert_zero(opts("zero"), T * H, h_y));

	/* Row counts shape the tasks, so the graph reads them first. */
	int32_t counts[8];
	assert_int_equal(starpu_data_acquire(h_counts, STARPU_R), 0);
	memcpy(counts, (int32_t *)starpu_data_get_local_ptr(h_counts), sizeof(counts));
	starpu_data_release(h_counts);

	int64_t first = 0;
	for (int64_t j = 0; j < n_parts; j++) {
		int64_t rows_per_expert[2], m = 0;
		for (int64_t e = 0; e < ne; e++)
			m += rows_per_expert[e] = counts[j * ne + e];
		if (m == 0)
			continue;
		struct rmoe_pair_slice sl = {.first = first, .count = m, .hidden = H, .topk = K};
		struct rmoe_expert_shape ea = expert_shape(H, F, ne, rows_per_expert);
		starpu_data_handle_t h_rows = vec_tmp(m * H), h_out = vec_tmp(m * H);
		starpu_data_handle_t h_work = vec_tmp(3 * m * F);
		INSERT(rmoe_insert_gather(opts("gather"), &sl, h_x, h_pairs, NULL, h_rows));
		INSERT(rmoe_insert_expert_ffn(opts("expert-ffn"), &ea, h_rows, h_parts[j], h_work, h_out));
		INSERT(rmoe_insert_scatter_add(opts("scatter-add"), &sl, h_out, h_pairs, h_tw, h_y));
		starpu_data_unregister_submit(h_rows);
		starpu_data_unregister_submit(h_work);
		starpu_data_unregister_submit(h_out);
		first += m;
	}
	assert_int_equal(first, T * K);

	int32_t idx[24 * 2];
	assert_int_equal(starpu_data_acquire(h_idx, STARPU_R), 0);
	memcpy(idx, (int32_t *)starpu_data_get_local_ptr(h_idx), sizeof(idx));
	starpu_data_release(h_idx);
	wait_all();
	starpu_data_unregister(h_x);
	starpu_data_unregister(h_wr);
	starpu_data_unregister(h_y);
	starpu_data_unregister(h_idx);
	starpu_data_unregister(h_tw);
	starpu_data_unregister(h_pairs);
	starpu_data_unregister(h_counts);
	unregister_all(h_parts, (int)n_parts);

	double probs[24 * 8], tw[24 * 2], gate[12], up[12], act[12], out[16];
	int32_t ref_idx[24 * 2];
	double *ref_y = xcalloc(T * H, sizeof(double));
	ref_route(x, w_router, T, H, E, K, 1, probs, ref_idx, tw);
	assert_memory_equal(idx, ref_idx, sizeof(idx));
	for (int64_t t = 0; t < T; t++)
		for (int64_t k = 0; k < K; k++) {
			int64_t e = ref_idx[t * K + k];
			struct ref_expert ex = ref_expert_of(parts[e / ne], ne, H, F, e % ne);
			ref_expert_fwd(&ex, x + t * H, gate, up, act, out);
			for (int64_t h = 0; h < H; h++)
				ref_y[t * H + h] += tw[t * K + k] * out[h];
		}
	assert_rel_err(rel_err_d(y, ref_y, T * H), TOL_F32);

	free(x);
	free(w_router);
	for (int64_t j = 0; j < n_parts; j++)
		free(parts[j]);
	free(y);
	free(ref_y);
}

/* ---- memory probe, sizes and flops -------------------------------------- */

/* The probe records the peak of what StarPU holds, sampled by the tasks:
 * two temporaries that never live at once (a 4 MiB one, freed, then an 8 MiB
 * one) leave a peak of the larger, not of their sum; once both are freed a
 * reset peak is back where it started. */
static void test_codelets_probe_sees_temporaries(void **state)
{
	(void)state;
	if (on_cuda)
		skip(); /* the main-memory probe; the device's is checked by tests/gpu */
	const int64_t n = 1 << 20, fb = (int64_t)sizeof(float);
	wait_all();
	rmoe_probe_reset();
	const int64_t before = rmoe_probe_current();
	assert_int_equal(rmoe_probe_peak(), before);
	for (int64_t size = n; size <= 2 * n; size += n) {
		starpu_data_handle_t h = vec_tmp(size);
		INSERT(rmoe_insert_zero(opts("zero"), size, h));
		starpu_data_unregister_submit(h);
		wait_all();
		assert_int_equal(rmoe_probe_current(), before);
	}
	const int64_t peak = rmoe_probe_peak() - before;
	assert_true(peak >= 2 * n * fb);
	assert_true(peak < 3 * n * fb);
	rmoe_probe_reset();
	assert_int_equal(rmoe_probe_peak(), before);
}

static void test_codelets_sizes_and_flops(void **state)
{
	(void)state;
	assert_true(rmoe_flops_expert_ffn(10, 4, 3, 1) == 3 * 2.0 * 10 * 4 * 3);
	assert_true(rmoe_flops_expert_ffn(10, 4, 3, 0) == 2 * 2.0 * 10 * 4 * 3);
	assert_true(rmoe_flops_expert_bwd(10, 4, 3) == 6 * 2.0 * 10 * 4 * 3);
	assert_true(rmoe_flops_router(7, 4, 3) == 2.0 * 7 * 4 * 3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_codelets_router_fwd_renormalised),
		cmocka_unit_test(test_codelets_router_fwd_not_renormalised),
		cmocka_unit_test(test_codelets_router_fwd_k1_and_ke),
		cmocka_unit_test(test_codelets_router_fwd_ties_lower_expert_first),
		cmocka_unit_test(test_codelets_router_bwd_matches_finite_differences),
		cmocka_unit_test(test_codelets_dispatch_map_uneven_with_empty_experts),
		cmocka_unit_test(test_codelets_dispatch_map_all_to_one_expert),
		cmocka_unit_test(test_codelets_dispatch_map_k_equals_e),
		cmocka_unit_test(test_codelets_gather_rows_of_a_slice),
		cmocka_unit_test(test_codelets_scatter_add_into_tokens),
		cmocka_unit_test(test_codelets_expert_ffn_grouped_uneven),
		cmocka_unit_test(test_codelets_expert_ffn_all_rows_one_expert),
		cmocka_unit_test(test_codelets_bf16_rounding_to_nearest_even),
		cmocka_unit_test(test_codelets_bf16_operands_in_fp32_copies),
		cmocka_unit_test(test_codelets_expert_bwd_pair_weighted),
		cmocka_unit_test(test_codelets_expert_bwd_pair_rows),
		cmocka_unit_test(test_codelets_expert_bwd_preweighted),
		cmocka_unit_test(test_codelets_accumulate_and_zero),
		cmocka_unit_test(test_codelets_sort_chunks_round_trip),
		cmocka_unit_test(test_codelets_unpermute_bwd),
		cmocka_unit_test(test_codelets_single_rank_pipeline),
		cmocka_unit_test(test_codelets_probe_sees_temporaries),
		cmocka_unit_test(test_codelets_sizes_and_flops),
	};
	return cmocka_run_group_tests(tests, group_setup, codelets_fixture_stop);
}
