/* The "window" and "gate" under which the tasks of a pass are inserted.
 *
 * Window. StarPU starts any task whose data are ready: a worker idle while
 * hop h waits for its weights would gather the rows of hops h+1, h+2, ...
 * ahead of time, and each early gather keeps a hop's rows alive. That
 * prefetch buys nothing (gathers are cheap) and spends the memory the ring
 * exists to save. So the gathers of each chunk (a whole hop unless chunking
 * is on) wait for the last task of the chunk before, the one that frees
 * its last intermediate (the forward's scatter-add of the expert outputs,
 * the backward's expert task): one chunk's intermediates at a time, §3.3,
 * however many workers a rank has. (Waiting for the forward's expert task
 * only let a rank of several workers, or a GPU's pipelined stream, hold a
 * hop's outputs beside the next hop's rows: 12% above the model at 4 ranks
 * of 3 CPU workers.) These tasks are kept (not destroyed when they end) as
 * dependency anchors until the pass ends.
 *
 * Gate. A ring adds each hop's partial (expert routing: the weight gradient;
 * token routing: outputs, dx, dg) into the accumulator arriving from the
 * left; the partial lives until then. That addition becomes the window too:
 * the next hop's gathers, partials and expert task wait for it, as the
 * paper's GPU waits at this synchronisation point (§3.1), so one partial and
 * one hop's rows exist at a time whatever the network does. The accumulator
 * left its neighbour a hop before the next weights (or tokens) did, so the
 * wait rarely costs anything. */
#include <stdlib.h>

#include "rmoe_tasks.h"

struct rmoe_task_opts rmoe_opts(const struct rmoe_layer *L, const char *name, int prio)
{
	return (struct rmoe_task_opts){
		.status = L->tasks, .log = L->ctx->task_log, .name = name, .prio = prio,
		.deterministic = L->cfg.deterministic};
}

/* Room for one more anchor before a task that becomes one is submitted, so
 * that keeping it cannot fail afterwards. */
static int reserve_anchor(struct rmoe_pass *pass)
{
	return rmoe_pass_room(&pass->anchors, &pass->capanchors, pass->nanchors, sizeof(*pass->anchors), 16);
}

/* The options of a task that becomes the pass's window (and is kept as an
 * anchor); after a successful insert, become_window records it. */
static int window_opts(struct rmoe_pass *pass, struct rmoe_task_opts *o, struct starpu_task **kept)
{
	int rc = reserve_anchor(pass);
	o->kept = kept;
	return rc;
}

static void become_window(struct rmoe_pass *pass, struct starpu_task *t)
{
	pass->anchors[pass->nanchors++] = t;
	pass->window = t;
}

int rmoe_pass_gather(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_routing *rt,
                     starpu_data_handle_t src, int64_t first, int64_t count, int weighted,
                     starpu_data_handle_t rows, int prio, const char *name)
{
	struct rmoe_task_opts o = rmoe_opts(L, name, prio);
	o.after = pass ? pass->window : NULL;
	struct rmoe_pair_slice s = {first, count, L->H, L->K};
	return rmoe_insert_gather(&o, &s, src, rt->pair_order, weighted ? rt->topk_w : NULL, rows);
}

int rmoe_pass_scatter_add(struct rmoe_layer *L, struct rmoe_pass *anchor, const struct rmoe_routing *rt,
                          starpu_data_handle_t rows, int64_t first, int64_t count, int weighted,
                          starpu_data_handle_t dst, int prio, const char *name)
{
	struct rmoe_task_opts o = rmoe_opts(L, name, prio);
	struct starpu_task *t = NULL;
	int rc = anchor ? window_opts(anchor, &o, &t) : 0;
	struct rmoe_pair_slice s = {first, count, L->H, L->K};
	if (!rc)
		rc = rmoe_insert_scatter_add(&o, &s, rows, rt->pair_order, weighted ? rt->topk_w : NULL, dst);
	if (!rc && anchor)
		become_window(anchor, t);
	return rc;
}

int rmoe_pass_expert_ffn(struct rmoe_layer *L, struct rmoe_pass *anchor, starpu_data_handle_t rows,
                         starpu_data_handle_t w, int64_t n_experts, int64_t ffn, const int64_t *rows_per_expert,
                         int64_t nrows, starpu_data_handle_t work, starpu_data_handle_t out, int prio,
                         const char *name)
{
	struct rmoe_task_opts o = rmoe_opts(L, name, prio);
	struct starpu_task *t = NULL;
	int rc = anchor ? window_opts(anchor, &o, &t) : 0;
	struct rmoe_expert_shape s = {L->H, ffn, n_experts, nrows, rows_per_expert};
	if (!rc)
		rc = rmoe_insert_expert_ffn(&o, &s, rows, w, work, out);
	if (!rc && anchor)
		become_window(anchor, t);
	return rc;
}

int rmoe_pass_expert_bwd_pairs(struct rmoe_layer *L, struct rmoe_pass *anchor, const struct rmoe_routing *rt,
                               starpu_data_handle_t xrows, starpu_data_handle_t dyrows, starpu_data_handle_t w,
                               const struct rmoe_chunk *c, starpu_data_handle_t work, starpu_data_handle_t dx,
                               starpu_data_handle_t dw, int accumulate, int prio, const char *name)
{
	struct rmoe_task_opts o = rmoe_opts(L, name, prio);
	struct starpu_task *t = NULL;
	int rc = window_opts(anchor, &o, &t);
	/* The gate is consumed: one expert backward waits for each addition. */
	o.after = anchor->gate;
	anchor->gate = NULL;
	struct rmoe_expert_shape s = {L->H, L->F, L->e_local, c->rows, c->rows_per_expert};
	if (!rc)
		rc = rmoe_insert_expert_bwd_pairs(&o, &s, c->first, L->K, accumulate, xrows, dyrows, w, rt->pair_order,
		                                  rt->topk_w, work, dx, rt->dg, dw);
	if (!rc)
		become_window(anchor, t);
	return rc;
}

int rmoe_pass_accumulate(const struct rmoe_layer *L, struct rmoe_pass *gate_pass, starpu_data_handle_t src,
                         starpu_data_handle_t dst, int64_t count, int prio, const char *name)
{
	struct rmoe_task_opts o = rmoe_opts(L, name, prio);
	struct starpu_task *t = NULL;
	int rc = gate_pass ? window_opts(gate_pass, &o, &t) : 0;
	if (!rc)
		rc = rmoe_insert_accumulate(&o, count, src, dst);
	if (!rc && gate_pass) {
		become_window(gate_pass, t);
		gate_pass->gate = t;
	}
	return rc;
}

int rmoe_pass_zero(const struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dst, int64_t count,
                   int prio, const char *name)
{
	struct rmoe_task_opts o = rmoe_opts(L, name, prio);
	o.after = pass ? pass->window : NULL;
	return rmoe_insert_zero(&o, count, dst);
}

int rmoe_pass_fence(struct rmoe_layer *L, struct rmoe_pass *pass, const starpu_data_handle_t *ready, int nready,
                    const starpu_data_handle_t *next, int nnext, struct starpu_task *after, struct starpu_task **kept,
                    const char *name)
{
	struct rmoe_task_opts o = rmoe_opts(L, name, 0);
	struct starpu_task *t = NULL;
	o.after = after;
	int rc = kept ? reserve_anchor(pass) : 0;
	if (kept)
		o.kept = &t;
	if (!rc)
		rc = rmoe_insert_fence(&o, ready, nready, next, nnext);
	if (!rc && kept) {
		pass->anchors[pass->nanchors++] = t;
		*kept = t;
	}
	return rc;
}
