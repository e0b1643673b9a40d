/* The lean all-to-all's forward (a2a): Megatron-LM's dispatch (permute,
 * all-to-all, experts, all-to-all back, weighted unpermute), pipelined per
 * peer and per chunk as Tutel's overlap pipelines it.
 *
 * A rank's pairs are sorted by expert (the dispatch map), so the rows it
 * sends a peer come out of the permute already in that peer's expert
 * order: received, they are in their expert-major place, and the peer's
 * grouped SwiGLU runs on them as they are, one task per source rank and
 * chunk (no sort, no unsort copy). Each chunk's outputs go back as soon as
 * they are computed and are added at their tokens, weighted.
 *
 * Exchange order: at step i a rank sends to one peer and receives from
 * another, every step a permutation of the ranks (step 0: its own rows, no
 * transfer): on one node the pairwise schedule (me + i, me - i), on
 * several a node's own steps first, then one other node's at a time
 * (scheduler/exchange_order.c); a sender's tasks rank above the experts'
 * (alltoall_plan.c). Chunks of at most the chunk rows (the memory cap's,
 * or the configuration's; a whole block without).
 *
 * Depth: as a sender a rank has at most D chunks out (rmoe_a2a_depth) whose
 * results have not come back (a chunk's permute waits for the results of
 * the chunk that many before: the round trip is the sender's credit); as
 * an owner of experts at most that many received and not yet sent back (a
 * receive is posted, and its buffer allocated, once the results of the
 * chunk that many before have left). So a rank holds a bounded number of
 * chunks whatever the routing, and the memory model counts them
 * (scheduler/model/memory_model.c). Only the expert counts reach the host: the
 * rest is submitted at once, ordered by data dependencies. Every buffer is
 * released before anything that waits for its last task is submitted
 * (StarPU frees it when that task's successors are notified, in the order
 * they were declared). */
#include "rmoe_alltoall.h"

enum { KIND_X, KIND_OUT };

/* The grouped SwiGLU of one chunk, after the chunk before (one at a time);
 * x and work released (also after an earlier error rc, then returned). */
static int experts_ffn(int rc, struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_chunk *c,
                       starpu_data_handle_t x, starpu_data_handle_t work, starpu_data_handle_t out,
                       struct rmoe_a2a_depth *experts, int prio)
{
	struct rmoe_task_opts o = rmoe_opts(L, "expert-ffn", prio);
	o.after = experts->computed;
	struct rmoe_expert_shape es = {L->H, L->F, L->e_local, c->rows, c->rows_per_expert};
	if (!rc)
		rc = rmoe_insert_expert_ffn(&o, &es, x, L->h_w_part, work, out);
	/* Its inputs released before the fence the next chunk waits for is
	 * submitted (release order, file head). */
	starpu_data_unregister_submit(x);
	starpu_data_unregister_submit(work);
	if (!rc)
		rc = rmoe_pass_fence(L, pass, &out, 1, NULL, 0, NULL, &experts->computed, "a2a-computed");
	return rc;
}

/* My own rows (step 0): permute, experts, weighted unpermute into y. */
static int own_chunk(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_chunk *c, starpu_data_handle_t y,
                     struct rmoe_a2a_depth *experts, int prio)
{
	starpu_data_handle_t x = rmoe_act_vector(pass, L, c->rows * L->H);
	starpu_data_handle_t work = rmoe_act_vector(pass, L, c->rows * 3 * L->F);
	starpu_data_handle_t out = rmoe_act_vector(pass, L, c->rows * L->H);
	int rc = rmoe_a2a_gather(L, L->h_x, L->H, L->K, c->first, c->rows, x, rmoe_a2a_depth_wait(experts), prio,
	                         "permute");
	rc = experts_ffn(rc, L, pass, c, x, work, out, experts, prio);
	if (!rc)
		rc = rmoe_pass_scatter_add(L, NULL, &L->own, out, c->first, c->rows, 1, y, prio, "unpermute");
	struct starpu_task *done = NULL;
	int drc = rmoe_a2a_done(L, pass, &out, 1, &done);
	if (!rc && !(rc = drc))
		rmoe_a2a_depth_push(experts, done);
	return rc;
}

/* Chunk j of my rows for peer to: permuted and sent; its results received
 * and added at their tokens. */
static int token_chunk(struct rmoe_layer *L, struct rmoe_pass *pass, int to, int64_t j, const struct rmoe_chunk *c,
                       starpu_data_handle_t y, struct rmoe_a2a_depth *tokens, int prio)
{
	static const char *const what_x[1] = {"the all-to-all's rows"}, *const what_out[1] = {"the all-to-all's results"};
	struct starpu_task *credit = rmoe_a2a_depth_wait(tokens), *posted = NULL, *done = NULL;
	starpu_data_handle_t x = rmoe_act_vector(pass, L, c->rows * L->H);
	starpu_data_handle_t back = rmoe_act_vector(pass, L, c->rows * L->H);
	int rc = rmoe_a2a_gather(L, L->h_x, L->H, L->K, c->first, c->rows, x, credit, prio, "permute");
	/* The results' receive posted before the rows leave: they cannot
	 * arrive early. */
	if (!rc)
		rc = rmoe_a2a_post_recvs(L, pass, &back, 1, to, KIND_OUT, j, 0, credit, &posted, what_out);
	if (!rc)
		rc = rmoe_a2a_sends(L, pass, &x, 1, to, KIND_X, j, 1, posted, prio + 1, what_x);
	int drc = rmoe_a2a_done(L, pass, &x, 1, NULL);
	rc = rc ? rc : drc;
	if (!rc)
		rc = rmoe_pass_scatter_add(L, NULL, &L->own, back, c->first, c->rows, 1, y, prio, "unpermute");
	drc = rmoe_a2a_done(L, pass, &back, 1, &done);
	if (!rc && !(rc = drc))
		rmoe_a2a_depth_push(tokens, done);
	return rc;
}

/* Chunk j of peer from's rows for my experts: received in expert order,
 * computed, sent back. */
static int expert_chunk(struct rmoe_layer *L, struct rmoe_pass *pass, int from, int64_t j, const struct rmoe_chunk *c,
                        struct rmoe_a2a_depth *experts, int prio)
{
	static const char *const what_x[1] = {"the all-to-all's rows"}, *const what_out[1] = {"the all-to-all's results"};
	starpu_data_handle_t x = rmoe_act_vector(pass, L, c->rows * L->H);
	int rc = rmoe_a2a_post_recvs(L, pass, &x, 1, from, KIND_X, j, 1, rmoe_a2a_depth_wait(experts), NULL, what_x);
	starpu_data_handle_t work = rmoe_act_vector(pass, L, c->rows * 3 * L->F);
	starpu_data_handle_t out = rmoe_act_vector(pass, L, c->rows * L->H);
	rc = experts_ffn(rc, L, pass, c, x, work, out, experts, prio);
	if (!rc)
		rc = rmoe_a2a_sends(L, pass, &out, 1, from, KIND_OUT, j, 0, NULL, prio + 1, what_out);
	struct starpu_task *done = NULL;
	int drc = rmoe_a2a_done(L, pass, &out, 1, &done);
	if (!rc && !(rc = drc))
		rmoe_a2a_depth_push(experts, done);
	return rc;
}

int rmoe_a2a_own_forward(struct rmoe_a2a_run *r, int peer, int64_t j, const struct rmoe_chunk *c, int prio)
{
	(void)peer;
	(void)j;
	return own_chunk(r->L, r->pass, c, r->out, &r->experts, prio);
}

static int token_step(struct rmoe_a2a_run *r, int to, int64_t j, const struct rmoe_chunk *c, int prio)
{
	return token_chunk(r->L, r->pass, to, j, c, r->out, &r->tokens, prio);
}

static int expert_step(struct rmoe_a2a_run *r, int from, int64_t j, const struct rmoe_chunk *c, int prio)
{
	return expert_chunk(r->L, r->pass, from, j, c, &r->experts, prio);
}

int rmoe_alltoall_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y)
{
	static const struct rmoe_a2a_steps steps = {rmoe_a2a_own_forward, token_step, expert_step};
	struct rmoe_a2a_run r = {.L = L, .pass = pass, .out = y};
	return rmoe_a2a_forward_run(&r, &steps);
}
