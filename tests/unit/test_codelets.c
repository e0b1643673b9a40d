/* Unit tests of the codelets composed, and of the small ones: one rank's
 * forward (router, dispatch map, gather, expert FFN, weighted scatter-add)
 * against a token-by-token loop in double precision on seeded random
 * inputs; gradient accumulation and zeroing; the memory probe on
 * temporaries; the flop counts. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <starpu.h>

#include "cmocka_main.h"
#include "codelets_check.h"
#include "codelets_fixture.h"

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

RMOE_TEST_MAIN(codelets_group_setup, codelets_fixture_stop,
               cmocka_unit_test(test_codelets_accumulate_and_zero),
               cmocka_unit_test(test_codelets_single_rank_pipeline),
               cmocka_unit_test(test_codelets_probe_sees_temporaries),
               cmocka_unit_test(test_codelets_sizes_and_flops))
