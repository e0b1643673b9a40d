/* DeepEP's normal-mode dispatch sends a token once to each rank that owns
 * one of its experts (graph/dispatch/alltoall_deepep.c). Two small index tasks on
 * the host serve it: peer-counts adds to the expert counts, for each rank,
 * the tokens routed to it (the receivers size their buffers with them, so
 * they travel in the one counts exchange), and dedup-map turns one rank's
 * block of the pair order into its distinct tokens and each pair's slot
 * among them. */
#include "codelet.h"

/* buffers: 0 topk_idx [T*K], 1 expert_counts [E], 2 out [E + N] */
static void peer_counts_body(void *buffers[], const struct rmoe_dedup_args *a)
{
	const int64_t T = a->tokens, K = a->topk, E = a->experts, N = a->ranks;
	if (!(T >= 0 && K >= 1 && E >= 1 && N >= 1 && E % N == 0)) {
		rmoe_cl_fail("peer-counts", "bad shape T=%lld K=%lld E=%lld N=%lld", (long long)T, (long long)K,
		             (long long)E, (long long)N);
		return;
	}
	const struct rmoe_cl_buffer spec[] = {RMOE_CL_BUF("topk_idx", T * K), RMOE_CL_BUF("expert_counts", E),
	                                      RMOE_CL_BUF("peer_counts", E + N)};
	void *p[3];
	if (rmoe_cl_unpack("peer-counts", buffers, spec, 3, p))
		return;
	int64_t bad = rmoe_kernel_peer_counts(T, K, E, N, p[0], p[1], p[2]);
	if (bad >= 0)
		rmoe_cl_fail("peer-counts", "topk_idx[%lld] = %d, not an expert of %lld", (long long)bad,
		             (int)((const int32_t *)p[0])[bad], (long long)E);
}

/* buffers: 0 pair_order [T*K], 1 tokens [T], 2 codes [distinct*K] */
static void dedup_map_body(void *buffers[], const struct rmoe_dedup_args *a)
{
	const int64_t T = a->tokens, K = a->topk, D = a->distinct;
	if (!(T >= 0 && K >= 1 && a->first >= 0 && a->count >= 0 && a->first + a->count <= T * K && D >= 0 &&
	      D <= a->count && a->count <= D * K)) {
		rmoe_cl_fail("dedup-map", "bad block [%lld, %lld) of %lld pairs with %lld distinct tokens, K=%lld",
		             (long long)a->first, (long long)(a->first + a->count), (long long)(T * K), (long long)D,
		             (long long)K);
		return;
	}
	const struct rmoe_cl_buffer spec[] = {RMOE_CL_BUF("pair_order", T * K), RMOE_CL_BUF("tokens", T),
	                                      RMOE_CL_BUF("codes", D * K)};
	void *p[3];
	if (rmoe_cl_unpack("dedup-map", buffers, spec, 3, p))
		return;
	int32_t *tokens = p[1], *codes = p[2];
	const int32_t *order = p[0];
	int64_t bad = rmoe_kernel_first_bad_pair(order, a->first, a->count, T * K);
	if (bad >= 0) {
		rmoe_cl_fail("dedup-map", "pair_order[%lld] = %d, not a pair of %lld", (long long)(a->first + bad),
		             (int)order[a->first + bad], (long long)(T * K));
		return;
	}
	if (rmoe_kernel_dedup_map(K, a->first, a->count, order, D, tokens, codes)) {
		rmoe_cl_fail("dedup-map", "block [%lld, %lld) does not have the %lld distinct tokens counted",
		             (long long)a->first, (long long)(a->first + a->count), (long long)D);
		return;
	}
	/* The unused tail is sent too: deterministic bytes. */
	memset(tokens + D, 0, (size_t)(T - D) * sizeof(int32_t));
	memset(codes + a->count, 0, (size_t)(D * K - a->count) * sizeof(int32_t));
}

/* The peer counts are agreed on before anything depends on them (the
 * router's check, forward_backward.c); the codes travel to the experts'
 * rank, which indexes with them, so they are computed whatever failed
 * here (RMOE_CODELET_CPU). */
RMOE_CODELET_CPU(rmoe_cl_peer_counts, "peer-counts", peer_counts_body, "rmoe_peer_counts_v1", dispatch_map, 3, 0);
RMOE_CODELET_CPU(rmoe_cl_dedup_map, "dedup-map", dedup_map_body, "rmoe_dedup_map_v1", dispatch_map, 3, 1);

int rmoe_insert_peer_counts(const struct rmoe_task_opts *o, int64_t tokens, int64_t topk, int64_t experts,
                            int64_t ranks, starpu_data_handle_t topk_idx, starpu_data_handle_t expert_counts,
                            starpu_data_handle_t peer_counts)
{
	struct rmoe_dedup_args a = {tokens, topk, experts, ranks, 0, 0, 0};
	struct starpu_data_descr d[3] = {{topk_idx, STARPU_R}, {expert_counts, STARPU_R}, {peer_counts, STARPU_W}};
	return rmoe_cl_insert(o, &rmoe_cl_peer_counts, d, 3, rmoe_cl_args_dup(&a, sizeof(a)), sizeof(a), 0);
}

int rmoe_insert_dedup_map(const struct rmoe_task_opts *o, int64_t tokens, int64_t topk, int64_t first, int64_t count,
                          int64_t distinct, starpu_data_handle_t pair_order, starpu_data_handle_t token_list,
                          starpu_data_handle_t codes)
{
	struct rmoe_dedup_args a = {tokens, topk, 0, 0, first, count, distinct};
	struct starpu_data_descr d[3] = {{pair_order, STARPU_R}, {token_list, STARPU_W}, {codes, STARPU_W}};
	return rmoe_cl_insert(o, &rmoe_cl_dedup_map, d, 3, rmoe_cl_args_dup(&a, sizeof(a)), sizeof(a), 0);
}
