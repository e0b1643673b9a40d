/* Unit tests of the router codelets on seeded random inputs: the forward
 * (softmax, top-k with ties to the lower expert, the weights renormalised or
 * not) against the routing computed in double precision, and the backward
 * against central differences of a loss of the top-k weights. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <starpu.h>

#include "cmocka_main.h"
#include "codelets_check.h"
#include "codelets_fixture.h"

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

RMOE_TEST_MAIN(codelets_group_setup, codelets_fixture_stop,
               cmocka_unit_test(test_codelets_router_fwd_renormalised),
               cmocka_unit_test(test_codelets_router_fwd_not_renormalised),
               cmocka_unit_test(test_codelets_router_fwd_k1_and_ke),
               cmocka_unit_test(test_codelets_router_fwd_ties_lower_expert_first),
               cmocka_unit_test(test_codelets_router_bwd_matches_finite_differences))
