/* Unit tests of the codelets that move rows by the routing, on seeded random
 * routings against the obvious loops: the dispatch map (pairs sorted by
 * expert, empty experts included), gather and scatter-add of a slice of
 * experts' rows (weighted or not), sort_chunks (peer chunks sorted by expert
 * and back) and the unpermute backward. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <starpu.h>

#include "cmocka_main.h"
#include "codelets_check.h"
#include "relaymoe/relaymoe.h"
#include "codelets_fixture.h"
#include "rmoe_error.h"

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

/* ---- a2a-deepep's index tasks (codelet_dedup.c) ------------------------ */

/* peer-counts against the obvious loop, then each rank's block through
 * dedup-map: its tokens are those with a pair there, ascending, and each
 * pair's code names its token's slot and its top-k position. */
static void check_dedup(const int32_t *idx, int64_t T, int64_t K, int64_t E, int64_t N)
{
	const int64_t el = E / N;
	int32_t *topk_idx = xcalloc(T * K, sizeof(int32_t)), *order = xcalloc(T * K, sizeof(int32_t));
	int32_t *counts = xcalloc(E, sizeof(int32_t)), *peer = xcalloc(E + N, sizeof(int32_t));
	memcpy(topk_idx, idx, (size_t)(T * K) * sizeof(int32_t));
	ref_dispatch(idx, T, K, E, order, counts);
	for (int64_t i = 0; i < E + N; i++)
		peer[i] = -7;
	starpu_data_handle_t h[3] = {vec_i(topk_idx, T * K), vec_i(counts, E), vec_i(peer, E + N)};
	INSERT(rmoe_insert_peer_counts(opts("peer-counts"), T, K, E, N, h[0], h[1], h[2]));
	wait_all();
	unregister_all(h, 3);
	assert_memory_equal(peer, counts, (size_t)E * sizeof(int32_t));
	for (int64_t q = 0, first = 0; q < N; q++) {
		int64_t want = 0, rows = 0;
		for (int64_t t = 0; t < T; t++) {
			int hit = 0;
			for (int64_t k = 0; k < K; k++)
				hit |= idx[t * K + k] / el == q;
			want += hit;
		}
		assert_int_equal(peer[E + q], want);
		for (int64_t e = q * el; e < (q + 1) * el; e++)
			rows += counts[e];
		if (rows == 0)
			continue;
		const int64_t D = peer[E + q];
		int32_t *tokens = xcalloc(T, sizeof(int32_t)), *codes = xcalloc(D * K, sizeof(int32_t));
		starpu_data_handle_t g[3] = {vec_i(order, T * K), vec_i(tokens, T), vec_i(codes, D * K)};
		INSERT(rmoe_insert_dedup_map(opts("dedup-map"), T, K, first, rows, D, g[0], g[1], g[2]));
		wait_all();
		unregister_all(g, 3);
		for (int64_t i = 1; i < D; i++)
			assert_true(tokens[i - 1] < tokens[i]);
		for (int64_t i = 0; i < rows; i++) {
			const int32_t p = order[first + i];
			assert_true(codes[i] / K < D);
			assert_int_equal(tokens[codes[i] / K], p / K);
			assert_int_equal(codes[i] % K, p % K);
		}
		for (int64_t i = rows; i < D * K; i++)
			assert_int_equal(codes[i], 0);
		first += rows;
		free(tokens);
		free(codes);
	}
	free(topk_idx);
	free(order);
	free(counts);
	free(peer);
}

/* With CUDA workers only (the gpu label) the index tasks, which have a CPU
 * function only, are refused at submission with a code that says so, the
 * unsubmitted task freed (a StarPU 1.3 assertion once stopped the program
 * there); the layer refuses a2a-deepep earlier (layer.c). */
static void check_dedup_refused(void)
{
	const int64_t T = 5, K = 2, E = 4, N = 2;
	int32_t idx[10] = {0, 1, 2, 3, 0, 2, 1, 3, 0, 1}, order[10], counts[4], peer[6];
	ref_dispatch(idx, T, K, E, order, counts);
	for (int i = 0; i < 6; i++)
		peer[i] = -7;
	starpu_data_handle_t h[3] = {vec_i(idx, T * K), vec_i(counts, E), vec_i(peer, E + N)};
	assert_int_equal(rmoe_insert_peer_counts(opts("peer-counts"), T, K, E, N, h[0], h[1], h[2]), RMOE_ESTARPU);
	assert_non_null(strstr(rmoe_last_error_message(), "no StarPU worker can run"));
	wait_all();
	unregister_all(h, 3);
}

static void test_codelets_dedup_skewed_and_even(void **state)
{
	(void)state;
	if (on_cuda) {
		check_dedup_refused();
		return;
	}
	const int64_t T = 37, K = 3, E = 12;
	struct rng r = {33};
	int32_t *idx = xcalloc(T * K, sizeof(int32_t));
	random_routing(&r, T, K, E, NULL, 0, idx);
	check_dedup(idx, T, K, E, 4);
	check_dedup(idx, T, K, E, 1);
	/* experts 6-11 idle: ranks 2 and 3 of 4 get no block */
	const int allowed[12] = {1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0};
	random_routing(&r, T, K, E, allowed, 1, idx);
	check_dedup(idx, T, K, E, 4);
	free(idx);
}

/* A block whose distinct tokens are not the ones counted fails the task. */
static void test_codelets_dedup_map_wrong_count_fails(void **state)
{
	(void)state;
	if (on_cuda)
		return; /* refused at submission there: check_dedup_refused */
	const int64_t T = 5, K = 2, E = 4;
	int32_t idx[10] = {0, 1, 2, 3, 0, 2, 1, 3, 0, 1};
	int32_t order[10], counts[4], tokens[5], codes[8];
	ref_dispatch(idx, T, K, E, order, counts);
	struct rmoe_task_status st;
	rmoe_task_status_reset(&st);
	struct rmoe_task_opts o = *opts("dedup-map");
	o.status = &st;
	starpu_data_handle_t g[3] = {vec_i(order, T * K), vec_i(tokens, T), vec_i(codes, 8)};
	/* experts 0 and 1 hold 6 pairs of 4 tokens (0, 2, 3, 4): 4 is right, 3 wrong */
	assert_int_equal(rmoe_insert_dedup_map(&o, T, K, 0, counts[0] + counts[1], 4, g[0], g[1], g[2]), 0);
	wait_all();
	assert_int_equal(rmoe_task_status_check(&st), 0);
	unregister_all(g, 3);
	int32_t codes3[6];
	starpu_data_handle_t b[3] = {vec_i(order, T * K), vec_i(tokens, T), vec_i(codes3, 6)};
	assert_int_equal(rmoe_insert_dedup_map(&o, T, K, 0, counts[0] + counts[1], 3, b[0], b[1], b[2]), 0);
	wait_all();
	assert_int_equal(rmoe_task_status_check(&st), RMOE_ESTARPU);
	unregister_all(b, 3);
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

RMOE_TEST_MAIN(codelets_group_setup, codelets_fixture_stop,
               cmocka_unit_test(test_codelets_dispatch_map_uneven_with_empty_experts),
               cmocka_unit_test(test_codelets_dispatch_map_all_to_one_expert),
               cmocka_unit_test(test_codelets_dispatch_map_k_equals_e),
               cmocka_unit_test(test_codelets_dedup_skewed_and_even),
               cmocka_unit_test(test_codelets_dedup_map_wrong_count_fails),
               cmocka_unit_test(test_codelets_gather_rows_of_a_slice),
               cmocka_unit_test(test_codelets_scatter_add_into_tokens),
               cmocka_unit_test(test_codelets_sort_chunks_round_trip),
               cmocka_unit_test(test_codelets_unpermute_bwd))
