/* The lean all-to-all's backward (a2a), with the ring's kernel discipline
 * (§3.3) and the forward's plan: no counts exchanged again, no host wait.
 * Per chunk, as in the forward (alltoall_fwd.c: the exchange order, the
 * depth of chunks in flight): the sender gathers the x rows, the dy rows
 * (unweighted) and the routing weights of the chunk's pairs and sends them
 * to the experts' rank; there the pair-weighted expert backward recomputes
 * from x, applies the weight and produces dg in the kernel, and leaves the
 * rows' dx over the received x rows (2H + 4F per row live, as a ring hop);
 * those and the dg go straight back, added at their tokens and pairs. The
 * weight gradient accumulates over the chunks in submission order. */
#include "rmoe_alltoall.h"

enum { KIND_X, KIND_DY, KIND_G, KIND_DX, KIND_DG };
static const char *const what_inputs[3] = {"the all-to-all's x rows", "the all-to-all's dy rows",
                                           "the all-to-all's weights"};
static const char *const what_results[2] = {"the all-to-all's dx rows", "the all-to-all's dg"};

/* A chunk's three inputs of my pairs [first, first + rows): x and dy rows,
 * routing weights; after the task after. */
static int gather_inputs(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy, const struct rmoe_chunk *c,
                         starpu_data_handle_t in[3], struct starpu_task *after, int prio)
{
	in[0] = rmoe_act_vector(pass, L, c->rows * L->H);
	in[1] = rmoe_act_vector(pass, L, c->rows * L->H);
	in[2] = rmoe_temp_vector(pass, c->rows, sizeof(float));
	int rc = rmoe_a2a_gather(L, L->h_x, L->H, L->K, c->first, c->rows, in[0], after, prio, "permute");
	if (!rc)
		rc = rmoe_a2a_gather(L, dy, L->H, L->K, c->first, c->rows, in[1], after, prio, "permute-dy");
	if (!rc)
		rc = rmoe_a2a_gather(L, L->h_topk_w, 1, 1, c->first, c->rows, in[2], after, prio, "permute-g");
	return rc;
}

/* The dx rows and dg of my pairs [first, first + rows) added at their
 * tokens (the weight is in) and pairs. */
static int add_results(struct rmoe_layer *L, const struct rmoe_chunk *c, starpu_data_handle_t dxrows,
                       starpu_data_handle_t dgrows, starpu_data_handle_t dx, int prio)
{
	int rc = rmoe_pass_scatter_add(L, NULL, &L->own, dxrows, c->first, c->rows, 0, dx, prio, "unpermute-dx");
	struct rmoe_task_opts o = rmoe_opts(L, "unpermute-dg", prio);
	struct rmoe_pair_slice s = {c->first, c->rows, 1, 1};
	if (!rc)
		rc = rmoe_insert_scatter_add(&o, &s, dgrows, L->h_pair_order, NULL, L->h_dg);
	return rc;
}

/* The expert stage of one chunk on its x, dy and g rows (in): recompute,
 * then the pair-weighted backward with the identity pair order (K = 1);
 * the rows' dx left in in[0], the dg of each row into *dg. in[1] and in[2]
 * are released. */
static int expert_stage(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_chunk *c,
                        starpu_data_handle_t in[3], int *accumulate, starpu_data_handle_t *dg,
                        struct rmoe_a2a_depth *experts, int prio)
{
	starpu_data_handle_t work = rmoe_act_vector(pass, L, c->rows * 4 * L->F);
	starpu_data_handle_t order = rmoe_a2a_identity(L, c->rows);
	*dg = rmoe_temp_vector(pass, c->rows, sizeof(float));
	struct rmoe_expert_shape es = {L->H, L->F, L->e_local, c->rows, c->rows_per_expert};
	/* One chunk at a time (struct rmoe_a2a_depth): the recompute after the
	 * chunk before's backward. */
	struct rmoe_task_opts o = rmoe_opts(L, "recompute", prio);
	o.after = experts->computed;
	int rc = rmoe_insert_expert_ffn(&o, &es, in[0], L->h_w_part, work, NULL);
	/* The kernel writes every row's dg, but StarPU reads a buffer that a
	 * task updates (STARPU_RW): it must hold values first. */
	o = rmoe_opts(L, "zero-dg-rows", prio);
	if (!rc)
		rc = rmoe_insert_zero(&o, c->rows, *dg);
	o = rmoe_opts(L, "expert-bwd", prio);
	if (!rc)
		rc = rmoe_insert_expert_bwd_pairs(&o, &es, 0, 1, *accumulate, in[0], in[1], L->h_w_part, order, in[2], work,
		                                  NULL, *dg, L->h_dw_part);
	*accumulate = 1;
	/* Released before the fence the next chunk waits for is submitted
	 * (release order, alltoall_fwd.c). */
	starpu_data_unregister_submit(order);
	starpu_data_unregister_submit(work);
	starpu_data_unregister_submit(in[1]);
	starpu_data_unregister_submit(in[2]);
	in[1] = in[2] = NULL;
	if (!rc)
		rc = rmoe_pass_fence(L, pass, &in[0], 1, NULL, 0, NULL, &experts->computed, "a2a-computed");
	return rc;
}

/* The end of a chunk on my experts: its results done with (sent, or added
 * here), the inputs an early failure left registered released, and the
 * chunk counted in flight until then. */
static int experts_end(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t in[3],
                       starpu_data_handle_t res[2], struct rmoe_a2a_depth *experts, int rc)
{
	struct starpu_task *done = NULL;
	int drc = rmoe_a2a_done(L, pass, res, 2, &done);
	for (int k = 1; k < 3; k++)
		if (in[k])
			starpu_data_unregister_submit(in[k]);
	if (!rc && !(rc = drc))
		rmoe_a2a_depth_push(experts, done);
	return rc;
}

/* My own rows (step 0): no transfer. */
static int own_chunk(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_chunk *c, starpu_data_handle_t dy,
                     starpu_data_handle_t dx, int *accumulate, struct rmoe_a2a_depth *experts, int prio)
{
	starpu_data_handle_t in[3], res[2] = {NULL, NULL};
	int rc = gather_inputs(L, pass, dy, c, in, rmoe_a2a_depth_wait(experts), prio);
	if (!rc)
		rc = expert_stage(L, pass, c, in, accumulate, &res[1], experts, prio);
	res[0] = in[0];
	if (!rc)
		rc = add_results(L, c, res[0], res[1], dx, prio);
	return experts_end(L, pass, in, res, experts, rc);
}

/* Chunk j of my pairs for peer to: its inputs out, its dx rows and dg
 * back and added. */
static int token_chunk(struct rmoe_layer *L, struct rmoe_pass *pass, int to, int64_t j, const struct rmoe_chunk *c,
                       starpu_data_handle_t dy, starpu_data_handle_t dx, struct rmoe_a2a_depth *tokens, int prio)
{
	struct starpu_task *credit = rmoe_a2a_depth_wait(tokens), *posted = NULL, *done = NULL;
	starpu_data_handle_t in[3];
	int rc = gather_inputs(L, pass, dy, c, in, credit, prio);
	starpu_data_handle_t back[2] = {rmoe_act_vector(pass, L, c->rows * L->H),
	                                rmoe_temp_vector(pass, c->rows, sizeof(float))};
	/* The results' receives posted before the inputs leave: they cannot
	 * arrive early. */
	if (!rc)
		rc = rmoe_a2a_post_recvs(L, pass, back, 2, to, KIND_DX, j, 0, credit, &posted, what_results);
	if (!rc)
		rc = rmoe_a2a_sends(L, pass, in, 3, to, KIND_X, j, 1, posted, prio + 1, what_inputs);
	int drc = rmoe_a2a_done(L, pass, in, 3, NULL);
	rc = rc ? rc : drc;
	if (!rc)
		rc = add_results(L, c, back[0], back[1], dx, prio);
	drc = rmoe_a2a_done(L, pass, back, 2, &done);
	if (!rc && !(rc = drc))
		rmoe_a2a_depth_push(tokens, done);
	return rc;
}

/* Chunk j of peer from's pairs for my experts: inputs in, dx rows and dg
 * out. */
static int expert_chunk(struct rmoe_layer *L, struct rmoe_pass *pass, int from, int64_t j, const struct rmoe_chunk *c,
                        int *accumulate, struct rmoe_a2a_depth *experts, int prio)
{
	struct starpu_task *after = rmoe_a2a_depth_wait(experts);
	starpu_data_handle_t in[3] = {rmoe_act_vector(pass, L, c->rows * L->H), rmoe_act_vector(pass, L, c->rows * L->H),
	                              rmoe_temp_vector(pass, c->rows, sizeof(float))};
	starpu_data_handle_t res[2] = {NULL, NULL};
	int rc = rmoe_a2a_post_recvs(L, pass, in, 3, from, KIND_X, j, 1, after, NULL, what_inputs);
	if (!rc)
		rc = expert_stage(L, pass, c, in, accumulate, &res[1], experts, prio);
	res[0] = in[0];
	if (!rc)
		rc = rmoe_a2a_sends(L, pass, res, 2, from, KIND_DX, j, 0, NULL, prio + 1, what_results);
	return experts_end(L, pass, in, res, experts, rc);
}

int rmoe_a2a_own_backward(struct rmoe_a2a_run *r, int peer, int64_t j, const struct rmoe_chunk *c, int prio)
{
	(void)peer;
	(void)j;
	return own_chunk(r->L, r->pass, c, r->dy, r->out, &r->accumulate, &r->experts, prio);
}

static int token_step(struct rmoe_a2a_run *r, int to, int64_t j, const struct rmoe_chunk *c, int prio)
{
	return token_chunk(r->L, r->pass, to, j, c, r->dy, r->out, &r->tokens, prio);
}

static int expert_step(struct rmoe_a2a_run *r, int from, int64_t j, const struct rmoe_chunk *c, int prio)
{
	return expert_chunk(r->L, r->pass, from, j, c, &r->accumulate, &r->experts, prio);
}

int rmoe_alltoall_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                           starpu_data_handle_t dx)
{
	static const struct rmoe_a2a_steps steps = {rmoe_a2a_own_backward, token_step, expert_step};
	struct rmoe_a2a_run r = {.L = L, .pass = pass, .dy = dy, .out = dx};
	return rmoe_a2a_backward_run(&r, &steps, 0);
}
