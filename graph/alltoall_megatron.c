/* Megatron-LM's all-to-all (a2a-megatron), in the style of its dispatcher
 * (paper Fig. 2): permute and top-k-expand the tokens by destination,
 * exchange counts, then rows (all-to-all as point-to-point StarPU-MPI
 * transfers), sort by local expert, grouped SwiGLU, unsort, all-to-all
 * back, weighted unpermute. Its buffers hold all T*K routed rows at once.
 *
 * The backward follows Megatron's MoE-layer recomputation: the whole block
 * is run forward again (dispatch, experts keeping their intermediates,
 * combine back to the source ranks), then the reverse path: unpermute
 * backward (dg and the weighted output gradients), all-to-all, sort,
 * preweighted expert backward (a separate dx rows buffer: 3H + 3F per row
 * live, and the kept outputs), unsort, all-to-all back, unpermute into dx.
 * It reuses the forward's plan (alltoall_plan.c): no counts again.
 *
 * Buffers are released as soon as their last task is submitted, as a
 * caching allocator would reuse them. Everything after the counts is
 * submitted at once, the row exchanges as StarPU-MPI requests ordered by
 * data dependencies, as Megatron queues its all-to-alls on the GPU stream.
 * Each exchange is framed by two ordering tasks (exchange()) so that a
 * stage's buffers come to exist only after the previous stage's are gone:
 * the peaks are those of the stages in turn (scheduler/memory_model.c), as
 * with a collective on a stream and a caching allocator.
 *
 * Release order: StarPU frees a released buffer when the release's own
 * control task, which waits for the buffer's last task, runs; that happens
 * inline in the thread ending that task, as it notifies the task's
 * successors in the order they were declared. A task of the next stage
 * declared before the release is notified first, may start on another
 * worker and allocate while the buffer still exists: a peak the stages in
 * turn never have. So every buffer is released before anything that waits
 * for its last task is submitted. */
#include <stdlib.h>
#include <string.h>

#include "rmoe_alltoall.h"

enum { TAG_COUNTS, TAG_DISPATCH, TAG_COMBINE, TAG_DOUT, TAG_DX };

/* after: a task the sort waits for, or NULL. */
static int submit_sort_rows(struct rmoe_layer *L, const struct rmoe_a2a_plan *p, enum rmoe_sort_direction direction,
                            int64_t width, starpu_data_handle_t *per_peer, starpu_data_handle_t sorted,
                            const char *name, struct starpu_task *after)
{
	struct rmoe_task_opts o = rmoe_opts(L, name, 0);
	o.after = after;
	return rmoe_insert_sort_chunks(&o, direction, width, p->N, L->e_local, p->chunk_rows, per_peer, sorted);
}

static int submit_sort(struct rmoe_layer *L, const struct rmoe_a2a_plan *p, enum rmoe_sort_direction direction,
                       starpu_data_handle_t *per_peer, starpu_data_handle_t sorted, const char *name,
                       struct starpu_task *after)
{
	return submit_sort_rows(L, p, direction, L->H, per_peer, sorted, name, after);
}

static int submit_unpermute_bwd(struct rmoe_layer *L, starpu_data_handle_t dy, starpu_data_handle_t back,
                                int64_t first, int64_t count, starpu_data_handle_t dout, struct starpu_task *after)
{
	struct rmoe_task_opts o = rmoe_opts(L, "unpermute-bwd", 0);
	o.after = after;
	struct rmoe_pair_slice s = {first, count, L->H, L->K};
	return rmoe_insert_unpermute_bwd(&o, &s, dy, back, L->h_pair_order, L->h_topk_w, dout, L->h_dg);
}

/* Point-to-point all-to-all of per-peer row buffers: out[q] (rows_out[q])
 * goes to q, in[q] (rows_in[q], registered here) comes from q; the local
 * part is handed over without a copy. Submitted whole: the host waits for
 * nothing. The sent buffers are released.
 *
 * It still behaves as a collective all-to-all queued on a stream, the way
 * Megatron's runs on the GPU, through data dependencies (file head):
 * - StarPU-MPI posts a receive, and allocates its buffer, once the handle's
 *   earlier accesses have ended: on a fresh handle, at once. A first access
 *   of every receive handle (a fence) waits for the exchange's inputs (the
 *   previous stage has run and its buffers are gone) and for the previous
 *   exchange's completion (*done on entry: all there is to wait for where
 *   this rank's previous stage had no rows). Without it every receive
 *   buffer of a pass would exist from the pass's submission.
 * - A second fence reads every receive and writes every sent buffer, so it
 *   ends after the last transfer; the sent buffers, unregistered after it,
 *   are freed when it ends. It is kept and returned in *done: the next
 *   stage's first tasks wait for it, so they allocate nothing while a send
 *   still holds its buffer, which the peer may receive late.
 * No starpu_mpi_wait: it would run MPI_Wait inside StarPU-MPI's progress
 * thread, which then serves nothing else; two ranks waiting on sends whose
 * receives the other's stalled thread has not posted deadlock. A lost peer
 * leaves a transfer pending: the pass's end (rmoe_pass_finish) waits within
 * wait_timeout and gives RMOE_EPEER, naming the peers of the earliest
 * transfers that never completed (rmoe_pass_watch): no host wait here sees
 * which peer is missing any more. */
static int exchange_rows(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_a2a_plan *p,
                         starpu_data_handle_t *out, const int64_t *rows_out, starpu_data_handle_t *in,
                         const int64_t *rows_in, int64_t width, size_t elsize, int phase,
                         struct starpu_task **done)
{
	const int N = p->N, me = p->me;
	const int64_t tag = pass->tag_base + phase;
	for (int q = 0; q < N; q++)
		in[q] = q != me && rows_in[q] > 0 ? rmoe_temp_vector(pass, rows_in[q] * width, elsize) : NULL;
	int rc = rmoe_pass_fence(L, pass, out, N, in, N, *done, NULL, "a2a-post");
	for (int q = 0; q < N && !rc; q++)
		if (in[q] && !(rc = rmoe_recv(L, in[q], q, tag)))
			rc = rmoe_pass_watch(L, pass, in[q], q, tag, 1, "the all-to-all's rows");
	for (int q = 0; q < N && !rc; q++)
		if (q != me && rows_out[q] > 0 && !(rc = rmoe_send(L, pass, out[q], q, tag, 1, NULL, NULL)))
			rc = rmoe_pass_watch(L, pass, out[q], q, tag, 0, "the all-to-all's rows");
	in[me] = out[me];
	out[me] = NULL;
	if (!rc)
		rc = rmoe_pass_fence(L, pass, in, N, out, N, NULL, done, "a2a-done");
	for (int q = 0; q < N; q++)
		if (out[q]) {
			/* A sent buffer's last access is StarPU-MPI's, which
			 * releases the data while it still holds the handle busy:
			 * an unregistration alone would free it only once that
			 * release returns, after the fence's successors (the next
			 * stage) have started. The invalidation frees it at once,
			 * before them (release order, file head). */
			starpu_data_invalidate_submit(out[q]);
			starpu_data_unregister_submit(out[q]);
			out[q] = NULL;
		}
	return rc;
}

/* Rows of H activations, every exchange of Megatron's graph. */
static int exchange(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_a2a_plan *p,
                    starpu_data_handle_t *out, const int64_t *rows_out, starpu_data_handle_t *in,
                    const int64_t *rows_in, int phase, struct starpu_task **done)
{
	return exchange_rows(L, pass, p, out, rows_out, in, rows_in, L->H, L->act, phase, done);
}

/* The i-th of a block of per-peer handle arrays (N each), one allocation
 * per graph; NULL when the block is. */
static starpu_data_handle_t *peers(starpu_data_handle_t *block, int N, int i)
{
	return block ? block + (size_t)i * (size_t)N : NULL;
}

static void release_all(starpu_data_handle_t *h, int n)
{
	if (!h)
		return;
	for (int i = 0; i < n; i++)
		if (h[i]) {
			starpu_data_unregister_submit(h[i]);
			h[i] = NULL;
		}
}

/* The forward path up to the expert outputs returned to their source ranks
 * (back[q], rows of my pairs in partition q). With keep != NULL the sorted
 * input and the expert intermediates are kept for the backward (recompute).
 * *done: the combine's completion (exchange). */
static int dispatch_compute_combine(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_a2a_plan *p,
                                    starpu_data_handle_t *back, starpu_data_handle_t *keep_sorted,
                                    starpu_data_handle_t *keep_work, struct starpu_task **done)
{
	const int N = p->N;
	starpu_data_handle_t *block = calloc((size_t)(3 * N), sizeof(*block));
	if (!block)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	starpu_data_handle_t *send = peers(block, N, 0), *recv = peers(block, N, 1), *ret_out = peers(block, N, 2);
	int rc = 0;
	/* dispatch preprocess: permute + top-k expand, one buffer per destination */
	for (int q = 0; q < N && !rc; q++)
		if (p->send_rows[q] > 0) {
			send[q] = rmoe_act_vector(pass, L, p->send_rows[q] * L->H);
			rc = rmoe_pass_gather(L, pass, &L->own, L->h_x, p->send_first[q], p->send_rows[q], 0, send[q], 1,
			                        "permute");
		}
	if (!rc)
		rc = exchange(L, pass, p, send, p->send_rows, recv, p->recv_rows, TAG_DISPATCH, done);

	starpu_data_handle_t sorted = NULL, work = NULL, outs = NULL;
	if (!rc && p->M > 0) {
		sorted = rmoe_act_vector(pass, L, p->M * L->H);
		rc = submit_sort(L, p, RMOE_SORT_BY_EXPERT, recv, sorted, "sort-by-expert", *done);
		release_all(recv, N);
		work = rmoe_act_vector(pass, L, p->M * 3 * L->F);
		outs = rmoe_act_vector(pass, L, p->M * L->H);
		if (!rc)
			rc = rmoe_pass_expert_ffn(L, NULL, sorted, L->h_w_part, L->e_local, L->F, p->rows_per_expert,
			                            p->M, work, outs, 0, "expert-ffn");
		if (keep_sorted) {
			*keep_sorted = sorted;
			*keep_work = work;
		} else {
			starpu_data_unregister_submit(sorted);
			starpu_data_unregister_submit(work);
		}
		/* combine preprocess: unsort to one buffer per source rank */
		for (int q = 0; q < N; q++)
			if (p->recv_rows[q] > 0)
				ret_out[q] = rmoe_act_vector(pass, L, p->recv_rows[q] * L->H);
		if (!rc)
			rc = submit_sort(L, p, RMOE_UNSORT_TO_PEERS, ret_out, outs, "unsort", NULL);
		starpu_data_unregister_submit(outs);
	}
	release_all(recv, N);
	if (!rc)
		rc = exchange(L, pass, p, ret_out, p->recv_rows, back, p->send_rows, TAG_COMBINE, done);
	release_all(ret_out, N);
	free(block);
	return rc;
}

int rmoe_alltoall_megatron_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y)
{
	struct starpu_task *done = NULL;
	int rc = rmoe_a2a_plan_build(L, pass);
	const struct rmoe_a2a_plan *p = L->a2a;
	starpu_data_handle_t *back = calloc((size_t)L->N, sizeof(*back));
	if (!rc && !back)
		rc = rmoe_error(RMOE_ENOMEM, "out of host memory");
	if (!rc)
		rc = dispatch_compute_combine(L, pass, p, back, NULL, NULL, &done);
	/* combine postprocess: weighted unpermute into y */
	for (int q = 0; q < L->N && !rc; q++)
		if (p->send_rows[q] > 0)
			rc = rmoe_pass_scatter_add(L, &L->own, back[q], p->send_first[q], p->send_rows[q], 1, y, 0,
			                             "unpermute");
	release_all(back, L->N);
	free(back);
	return rc;
}

/* Megatron's backward (file head): recompute, then the reverse path. */
int rmoe_alltoall_megatron_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                                    starpu_data_handle_t dx)
{
	const int N = L->N;
	const struct rmoe_a2a_plan *p;
	int rc = rmoe_a2a_plan_get(L, &p);
	starpu_data_handle_t *block = calloc((size_t)(5 * N), sizeof(*block));
	starpu_data_handle_t *back = peers(block, N, 0), *dout = peers(block, N, 1), *drecv = peers(block, N, 2);
	starpu_data_handle_t *dxsend = peers(block, N, 3), *dxback = peers(block, N, 4);
	if (!rc && !block)
		rc = rmoe_error(RMOE_ENOMEM, "out of host memory");

	/* Recompute of the whole block, keeping what autograd would save. */
	starpu_data_handle_t sorted = NULL, work = NULL;
	struct starpu_task *done = NULL;
	if (!rc)
		rc = dispatch_compute_combine(L, pass, p, back, &sorted, &work, &done);

	/* combine postprocess backward: dg = <dy, out>, dout = g dy */
	for (int q = 0; q < N && !rc; q++)
		if (p->send_rows[q] > 0) {
			dout[q] = rmoe_act_vector(pass, L, p->send_rows[q] * L->H);
			rc = submit_unpermute_bwd(L, dy, back[q], p->send_first[q], p->send_rows[q], dout[q], done);
		}
	release_all(back, N);
	if (!rc)
		rc = exchange(L, pass, p, dout, p->send_rows, drecv, p->recv_rows, TAG_DOUT, &done);

	if (!rc && p->M > 0) {
		starpu_data_handle_t dsorted = rmoe_act_vector(pass, L, p->M * L->H);
		rc = submit_sort(L, p, RMOE_SORT_BY_EXPERT, drecv, dsorted, "sort-by-expert", done);
		release_all(drecv, N);
		starpu_data_handle_t dxs = rmoe_act_vector(pass, L, p->M * L->H);
		struct rmoe_task_opts o = rmoe_opts(L, "expert-bwd", 0);
		struct rmoe_expert_shape es = {L->H, L->F, L->e_local, p->M, p->rows_per_expert};
		if (!rc)
			rc = rmoe_insert_expert_bwd_preweighted(&o, &es, 0, sorted, dsorted, L->h_w_part, work, dxs,
			                                        L->h_dw_part);
		/* Before the unsort, which waits for the expert backward too
		 * (release order, file head). */
		starpu_data_unregister_submit(dsorted);
		starpu_data_unregister_submit(sorted);
		starpu_data_unregister_submit(work);
		sorted = work = NULL;
		for (int q = 0; q < N; q++)
			if (p->recv_rows[q] > 0)
				dxsend[q] = rmoe_act_vector(pass, L, p->recv_rows[q] * L->H);
		if (!rc)
			rc = submit_sort(L, p, RMOE_UNSORT_TO_PEERS, dxsend, dxs, "unsort", NULL);
		starpu_data_unregister_submit(dxs);
	} else if (!rc) {
		rc = rmoe_pass_zero(NULL, L->h_dw_part, L->part_floats, 0, "zero-grad");
	}
	if (sorted)
		starpu_data_unregister_submit(sorted);
	if (work)
		starpu_data_unregister_submit(work);
	release_all(drecv, N);
	if (!rc)
		rc = exchange(L, pass, p, dxsend, p->recv_rows, dxback, p->send_rows, TAG_DX, &done);
	/* dispatch preprocess backward: unpermute (sum over k) into dx */
	for (int q = 0; q < N && !rc; q++)
		if (p->send_rows[q] > 0)
			rc = rmoe_pass_scatter_add(L, &L->own, dxback[q], p->send_first[q], p->send_rows[q], 0, dx, 0,
			                             "unpermute-dx");
	release_all(dxsend, N);
	release_all(dxback, N);
	free(block);
	return rc;
}


