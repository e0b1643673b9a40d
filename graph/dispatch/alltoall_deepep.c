/* DeepEP's normal-mode dispatch (a2a-deepep): each token sent once to each
 * rank that owns one of its experts, not once per (token, expert) pair.
 *
 * The counts exchange carries, beside every rank's expert counts, the
 * distinct tokens of each of its blocks (the peer counts of
 * codelet_dedup.c), so a receiver sizes a block's buffers by its tokens.
 * Per block, a host task (dedup-map) turns the block's slice of the pair
 * order into its distinct tokens and, for each pair, a code: its token's
 * slot times K plus its top-k position. The sender gathers the tokens' x
 * rows and their K routing weights and sends them with the codes; the
 * receiver expands the rows to its pairs by the codes (the pairs of a
 * block are in expert order, as the lean a2a's), runs the grouped SwiGLU,
 * and reduces each token's outputs, weighted, into one row (the combine's
 * reduction on the experts' rank), which goes back and is added at its
 * token. The backward mirrors it: x and dy rows once per token, expanded
 * there, the pair-weighted backward of the lean a2a (dg per pair, the
 * weight in dx), each token's dx reduced before it goes back, dg in the
 * same per-token layout of K values.
 *
 * DeepEP (deepseek-ai/DeepEP, normal kernels: get_dispatch_layout,
 * dispatch, combine) does this on GPUs with NVLink and RDMA buffers; here
 * StarPU-MPI carries the blocks, pipelined and bounded as the lean a2a's
 * (alltoall_fwd.c: the exchange order, rmoe_a2a_depth blocks in flight per
 * role, receivers' credits, one block on the experts at a time). A rank's
 * own block is the lean a2a's step 0 (nothing travels). Whole blocks only:
 * the receiver knows a block's tokens, not those of a chunk. The backward
 * reuses the forward's plan: no counts exchange, no host wait. */
#include "rmoe_alltoall.h"

enum { FWD_X, FWD_CODES, FWD_W, FWD_OUT };
enum { BWD_X, BWD_DY, BWD_CODES, BWD_W, BWD_DX, BWD_DG };

static const char *const what_fwd[3] = {"a2a-deepep's token rows", "a2a-deepep's pair codes",
                                        "a2a-deepep's routing weights"};
static const char *const what_out[1] = {"a2a-deepep's combined rows"};
static const char *const what_bwd[4] = {"a2a-deepep's token rows", "a2a-deepep's dy rows", "a2a-deepep's pair codes",
                                        "a2a-deepep's routing weights"};
static const char *const what_back[2] = {"a2a-deepep's dx rows", "a2a-deepep's dg"};

/* My block for peer to: its distinct tokens [T] (the first D meaningful)
 * and its pairs' codes [D*K], after the task after. */
static int block_map(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_a2a_plan *p, int to,
                     struct starpu_task *after, int prio, starpu_data_handle_t *tokens, starpu_data_handle_t *codes)
{
	*tokens = rmoe_temp_vector(pass, L->T, sizeof(int32_t));
	*codes = rmoe_temp_vector(pass, p->send_tokens[to] * L->K, sizeof(int32_t));
	struct rmoe_task_opts o = rmoe_opts(L, "dedup-map", prio);
	o.after = after;
	return rmoe_insert_dedup_map(&o, L->T, L->K, p->send_first[to], p->send_rows[to], p->send_tokens[to],
	                             L->h_pair_order, *tokens, *codes);
}

/* out [D, width] = rows of src [T, width] at the block's D tokens. */
static int token_rows(struct rmoe_layer *L, starpu_data_handle_t src, int64_t width, starpu_data_handle_t tokens,
                      int64_t D, starpu_data_handle_t out, struct starpu_task *after, int prio, const char *name)
{
	struct rmoe_task_opts o = rmoe_opts(L, name, prio);
	o.after = after;
	struct rmoe_pair_slice s = {0, D, width, 1};
	return rmoe_insert_gather(&o, &s, src, tokens, NULL, out);
}

/* dst [T, width] += rows [D, width] at the block's D tokens. */
static int add_token_rows(struct rmoe_layer *L, starpu_data_handle_t rows, int64_t width, starpu_data_handle_t tokens,
                          int64_t D, starpu_data_handle_t dst, int prio, const char *name)
{
	struct rmoe_task_opts o = rmoe_opts(L, name, prio);
	struct rmoe_pair_slice s = {0, D, width, 1};
	return rmoe_insert_scatter_add(&o, &s, rows, tokens, NULL, dst);
}

/* A received block's rows [D, H] expanded to its P pairs [P, H] by their
 * codes, after the task after (the block before off the experts). */
static int expand(struct rmoe_layer *L, starpu_data_handle_t rows, starpu_data_handle_t codes, int64_t P,
                  starpu_data_handle_t out, struct starpu_task *after, int prio, const char *name)
{
	struct rmoe_task_opts o = rmoe_opts(L, name, prio);
	o.after = after;
	struct rmoe_pair_slice s = {0, P, L->H, L->K};
	return rmoe_insert_gather(&o, &s, rows, codes, NULL, out);
}

/* out [D, H] = the sum over each token's pairs of their rows [P, H]
 * (times their routing weight when w is not NULL). out comes to exist
 * once the rows are computed (the fence), not while the block before is
 * on the experts. */
static int reduce(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t rows, starpu_data_handle_t codes,
                  starpu_data_handle_t w, int64_t P, int64_t D, starpu_data_handle_t out, int prio, const char *name)
{
	int rc = rmoe_pass_fence(L, pass, &rows, 1, &out, 1, NULL, NULL, "combine-after");
	if (!rc)
		rc = rmoe_pass_zero(L, NULL, out, D * L->H, prio, "zero-combine");
	struct rmoe_task_opts o = rmoe_opts(L, name, prio);
	struct rmoe_pair_slice s = {0, P, L->H, L->K};
	if (!rc)
		rc = rmoe_insert_scatter_add(&o, &s, rows, codes, w, out);
	return rc;
}

static void release(starpu_data_handle_t *h, int n)
{
	for (int i = 0; i < n; i++)
		if (h[i]) {
			starpu_data_unregister_submit(h[i]);
			h[i] = NULL;
		}
}

/* The end of a block: its buffers h done with (sent or added), the block
 * counted in flight (depth) until then. */
static int block_end(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t *h, int n,
                     struct rmoe_a2a_depth *depth, int rc)
{
	struct starpu_task *done = NULL;
	int drc = rmoe_a2a_done(L, pass, h, n, &done);
	if (!rc && !(rc = drc))
		rmoe_a2a_depth_push(depth, done);
	return rc;
}

/* The own block's outputs are added at their tokens before a peer's block
 * reaches the experts: a peer's first expansion waits for the own block's
 * end, not for its expert task alone. Otherwise they may or may not be
 * held beside that block, as the scheduler picks (the task that adds them
 * is ready with it), and the peak with them; in this order the memory
 * model knows the peak (scheduler/model/memory_model.c, deepep_blocks). */
static int own_added_first(struct rmoe_a2a_run *r, int64_t before, int rc)
{
	if (!rc && r->experts.n > before)
		r->experts.computed = rmoe_a2a_depth_last(&r->experts);
	return rc;
}

/* ---- forward ------------------------------------------------------------------------- */

static int own_block_fwd(struct rmoe_a2a_run *r, int peer, int64_t j, const struct rmoe_chunk *c, int prio)
{
	const int64_t before = r->experts.n;
	return own_added_first(r, before, rmoe_a2a_own_forward(r, peer, j, c, prio));
}

/* My block for peer to: token rows, codes and weights out; the combined
 * rows back and added at their tokens (the weights are in). */
static int token_block_fwd(struct rmoe_a2a_run *r, int to, int64_t j, const struct rmoe_chunk *c, int prio)
{
	(void)j;
	(void)c;
	struct rmoe_layer *L = r->L;
	struct rmoe_pass *pass = r->pass;
	const struct rmoe_a2a_plan *p = r->p;
	const int64_t D = p->send_tokens[to];
	struct starpu_task *credit = rmoe_a2a_depth_wait(&r->tokens), *posted = NULL;
	starpu_data_handle_t map[2] = {NULL, NULL}, in[3] = {NULL, NULL, NULL};
	int rc = block_map(L, pass, p, to, credit, prio, &map[0], &map[1]);
	in[0] = rmoe_act_vector(pass, L, D * L->H);
	in[1] = map[1];
	in[2] = rmoe_temp_vector(pass, D * L->K, sizeof(float));
	if (!rc)
		rc = token_rows(L, L->h_x, L->H, map[0], D, in[0], credit, prio, "dispatch-x");
	if (!rc)
		rc = token_rows(L, L->h_topk_w, L->K, map[0], D, in[2], credit, prio, "dispatch-w");
	starpu_data_handle_t back[2] = {rmoe_act_vector(pass, L, D * L->H), map[0]};
	/* The combined rows' receive posted before the tokens leave: they
	 * cannot arrive early. */
	if (!rc)
		rc = rmoe_a2a_post_recvs(L, pass, back, 1, to, FWD_OUT, 0, 0, credit, &posted, what_out);
	if (!rc)
		rc = rmoe_a2a_sends(L, pass, in, 3, to, FWD_X, 0, 1, posted, prio + 1, what_fwd);
	int drc = rmoe_a2a_done(L, pass, in, 3, NULL);
	rc = rc ? rc : drc;
	if (!rc)
		rc = add_token_rows(L, back[0], L->H, back[1], D, r->out, prio, "combine-add");
	return block_end(L, pass, back, 2, &r->tokens, rc);
}

/* Peer from's block for my experts: token rows, codes and weights in,
 * expanded, computed, reduced per token and sent back. */
static int expert_block_fwd(struct rmoe_a2a_run *r, int from, int64_t j, const struct rmoe_chunk *c, int prio)
{
	(void)j;
	struct rmoe_layer *L = r->L;
	struct rmoe_pass *pass = r->pass;
	struct rmoe_a2a_depth *experts = &r->experts;
	const int64_t D = r->p->recv_tokens[from], P = c->rows;
	starpu_data_handle_t in[3] = {rmoe_act_vector(pass, L, D * L->H), rmoe_temp_vector(pass, D * L->K, sizeof(int32_t)),
	                              rmoe_temp_vector(pass, D * L->K, sizeof(float))};
	int rc = rmoe_a2a_post_recvs(L, pass, in, 3, from, FWD_X, 0, 1, rmoe_a2a_depth_wait(experts), NULL, what_fwd);
	/* One block on the experts at a time: its expanded rows come to exist
	 * once the block before is off them. */
	starpu_data_handle_t rows = rmoe_act_vector(pass, L, P * L->H);
	if (!rc)
		rc = expand(L, in[0], in[1], P, rows, experts->computed, prio, "expand");
	release(in, 1);
	starpu_data_handle_t work = rmoe_act_vector(pass, L, P * 3 * L->F), out = rmoe_act_vector(pass, L, P * L->H);
	struct rmoe_task_opts o = rmoe_opts(L, "expert-ffn", prio);
	o.after = experts->computed;
	struct rmoe_expert_shape es = {L->H, L->F, L->e_local, P, c->rows_per_expert};
	if (!rc)
		rc = rmoe_insert_expert_ffn(&o, &es, rows, L->h_w_part, work, out);
	starpu_data_handle_t gone[2] = {rows, work};
	release(gone, 2);
	starpu_data_handle_t res[1] = {rmoe_act_vector(pass, L, D * L->H)};
	if (!rc)
		rc = reduce(L, pass, out, in[1], in[2], P, D, res[0], prio, "combine-reduce");
	starpu_data_handle_t used[3] = {out, in[1], in[2]};
	release(used, 3);
	if (!rc)
		rc = rmoe_pass_fence(L, pass, res, 1, NULL, 0, NULL, &experts->computed, "a2a-computed");
	if (!rc)
		rc = rmoe_a2a_sends(L, pass, res, 1, from, FWD_OUT, 0, 0, NULL, prio + 1, what_out);
	return block_end(L, pass, res, 1, experts, rc);
}

int rmoe_alltoall_deepep_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y)
{
	/* Whole blocks (config.c refuses chunk rows): one chunk a block. */
	static const struct rmoe_a2a_steps steps = {own_block_fwd, token_block_fwd, expert_block_fwd};
	struct rmoe_a2a_run r = {.L = L, .pass = pass, .out = y};
	return rmoe_a2a_forward_run(&r, &steps);
}

/* ---- backward ------------------------------------------------------------------------ */

static int own_block_bwd(struct rmoe_a2a_run *r, int peer, int64_t j, const struct rmoe_chunk *c, int prio)
{
	const int64_t before = r->experts.n;
	return own_added_first(r, before, rmoe_a2a_own_backward(r, peer, j, c, prio));
}

/* My block for peer to: token rows, dy rows, codes and weights out; the
 * reduced dx rows and the dg back, added at their tokens. */
static int token_block_bwd(struct rmoe_a2a_run *r, int to, int64_t j, const struct rmoe_chunk *c, int prio)
{
	(void)j;
	(void)c;
	struct rmoe_layer *L = r->L;
	struct rmoe_pass *pass = r->pass;
	const struct rmoe_a2a_plan *p = r->p;
	const int64_t D = p->send_tokens[to];
	struct starpu_task *credit = rmoe_a2a_depth_wait(&r->tokens), *posted = NULL;
	starpu_data_handle_t map[2] = {NULL, NULL};
	int rc = block_map(L, pass, p, to, credit, prio, &map[0], &map[1]);
	starpu_data_handle_t in[4] = {rmoe_act_vector(pass, L, D * L->H), rmoe_act_vector(pass, L, D * L->H), map[1],
	                              rmoe_temp_vector(pass, D * L->K, sizeof(float))};
	if (!rc)
		rc = token_rows(L, L->h_x, L->H, map[0], D, in[0], credit, prio, "dispatch-x");
	if (!rc)
		rc = token_rows(L, r->dy, L->H, map[0], D, in[1], credit, prio, "dispatch-dy");
	if (!rc)
		rc = token_rows(L, L->h_topk_w, L->K, map[0], D, in[3], credit, prio, "dispatch-w");
	starpu_data_handle_t back[3] = {rmoe_act_vector(pass, L, D * L->H), rmoe_temp_vector(pass, D * L->K, sizeof(float)),
	                                map[0]};
	if (!rc)
		rc = rmoe_a2a_post_recvs(L, pass, back, 2, to, BWD_DX, 0, 0, credit, &posted, what_back);
	if (!rc)
		rc = rmoe_a2a_sends(L, pass, in, 4, to, BWD_X, 0, 1, posted, prio + 1, what_bwd);
	int drc = rmoe_a2a_done(L, pass, in, 4, NULL);
	rc = rc ? rc : drc;
	if (!rc)
		rc = add_token_rows(L, back[0], L->H, back[2], D, r->out, prio, "combine-dx");
	/* dg [T, K]: a token's K values, zero where the pair went elsewhere. */
	if (!rc)
		rc = add_token_rows(L, back[1], L->K, back[2], D, L->h_dg, prio, "combine-dg");
	return block_end(L, pass, back, 3, &r->tokens, rc);
}

/* Peer from's block for my experts: x and dy rows expanded to the pairs,
 * the recompute and the pair-weighted backward (the weight applied in the
 * kernel, dg per pair), each token's dx reduced; dx and dg sent back. */
static int expert_block_bwd(struct rmoe_a2a_run *r, int from, int64_t j, const struct rmoe_chunk *c, int prio)
{
	(void)j;
	struct rmoe_layer *L = r->L;
	struct rmoe_pass *pass = r->pass;
	struct rmoe_a2a_depth *experts = &r->experts;
	int *accumulate = &r->accumulate;
	const int64_t D = r->p->recv_tokens[from], P = c->rows;
	starpu_data_handle_t in[4] = {rmoe_act_vector(pass, L, D * L->H), rmoe_act_vector(pass, L, D * L->H),
	                              rmoe_temp_vector(pass, D * L->K, sizeof(int32_t)),
	                              rmoe_temp_vector(pass, D * L->K, sizeof(float))};
	int rc = rmoe_a2a_post_recvs(L, pass, in, 4, from, BWD_X, 0, 1, rmoe_a2a_depth_wait(experts), NULL, what_bwd);
	starpu_data_handle_t rows[2] = {rmoe_act_vector(pass, L, P * L->H), rmoe_act_vector(pass, L, P * L->H)};
	starpu_data_handle_t work = rmoe_act_vector(pass, L, P * 4 * L->F);
	starpu_data_handle_t dg = rmoe_temp_vector(pass, D * L->K, sizeof(float));
	/* One expansion after the other, and the workspace after both: each
	 * received input is freed before the next buffer of the block comes to
	 * exist. Otherwise both inputs may be held beside both expansions, or
	 * the dy rows beside the workspace, as the scheduler picks, and the
	 * peak with them (scheduler/model/memory_model.c, deepep_blocks, counts the
	 * phases of this order). */
	if (!rc)
		rc = expand(L, in[0], in[2], P, rows[0], experts->computed, prio, "expand");
	if (!rc)
		rc = rmoe_pass_fence(L, pass, &rows[0], 1, &rows[1], 1, NULL, NULL, "expand-after");
	if (!rc)
		rc = expand(L, in[1], in[2], P, rows[1], experts->computed, prio, "expand-dy");
	release(in, 2);
	if (!rc)
		rc = rmoe_pass_fence(L, pass, &rows[1], 1, &work, 1, NULL, NULL, "recompute-after");
	struct rmoe_expert_shape es = {L->H, L->F, L->e_local, P, c->rows_per_expert};
	struct rmoe_task_opts o = rmoe_opts(L, "recompute", prio);
	o.after = experts->computed;
	if (!rc)
		rc = rmoe_insert_expert_ffn(&o, &es, rows[0], L->h_w_part, work, NULL);
	/* The kernel writes the dg of each of the block's pairs; the codes
	 * leave the others of a token's K at zero. After the block before is
	 * off the experts, as the rest of this block's buffers. */
	o = rmoe_opts(L, "zero-dg-block", prio);
	o.after = experts->computed;
	if (!rc)
		rc = rmoe_insert_zero(&o, D * L->K, dg);
	o = rmoe_opts(L, "expert-bwd", prio);
	if (!rc)
		rc = rmoe_insert_expert_bwd_pairs(&o, &es, 0, L->K, *accumulate, rows[0], rows[1], L->h_w_part, in[2], in[3],
		                                  work, NULL, dg, L->h_dw_part);
	*accumulate = 1;
	starpu_data_handle_t gone[3] = {rows[1], work, in[3]};
	release(gone, 3);
	starpu_data_handle_t res[2] = {rmoe_act_vector(pass, L, D * L->H), dg};
	if (!rc)
		rc = reduce(L, pass, rows[0], in[2], NULL, P, D, res[0], prio, "reduce-dx");
	starpu_data_handle_t used[2] = {rows[0], in[2]};
	release(used, 2);
	if (!rc)
		rc = rmoe_pass_fence(L, pass, res, 2, NULL, 0, NULL, &experts->computed, "a2a-computed");
	if (!rc)
		rc = rmoe_a2a_sends(L, pass, res, 2, from, BWD_DX, 0, 0, NULL, prio + 1, what_back);
	return block_end(L, pass, res, 2, experts, rc);
}

int rmoe_alltoall_deepep_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                                  starpu_data_handle_t dx)
{
	/* The identity pair order serves the own block only. */
	static const struct rmoe_a2a_steps steps = {own_block_bwd, token_block_bwd, expert_block_bwd};
	struct rmoe_a2a_run r = {.L = L, .pass = pass, .dy = dy, .out = dx};
	return rmoe_a2a_backward_run(&r, &steps, 1);
}
