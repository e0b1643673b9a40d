/* Megatron Core's all-to-all (a2a-megatron): MoEAlltoAllTokenDispatcher as
 * of Megatron Core 0.13 (the release that moved the routing probabilities'
 * multiply from the unpermute into the experts' activation), unchanged in
 * this respect through 0.15. Stage by stage (paper Fig. 2): permute by
 * destination with the probabilities beside the tokens, the counts, then
 * the rows' all-to-all and the probabilities' own, both sorted by local
 * expert; the grouped SwiGLU; its outputs scaled by their probabilities on
 * the expert's rank and unsorted (Megatron Core scales inside the SwiGLU:
 * the same product, the same buffers: our unsort copies the rows anyway);
 * the all-to-all back; the unpermute without probabilities.
 *
 * The backward, with Megatron's recomputation of the MoE block, recomputes
 * the dispatch (rows and probabilities) and the experts, keeping what
 * autograd saves (the sorted input, the SwiGLU's input and output, the
 * probabilities: the [M,4F] workspace of the pair-weighted kernel holds
 * them and the activation gradient), but no combine outputs: the unpermute
 * has no probabilities, so its backward needs none. Then the reverse path:
 * dy rows per pair out (unweighted), sorted, the expert backward with the
 * probabilities applied and their gradient produced in the kernel (the
 * weighted SwiGLU's backward), dx rows and the probabilities' gradients
 * back through two all-to-alls, added at their tokens and pairs. It reuses
 * the forward's plan (alltoall_plan.c): no counts again.
 *
 * Buffers are released as soon as their last task is submitted, as a
 * caching allocator would reuse them. Everything after the counts is
 * submitted at once, the row exchanges as StarPU-MPI requests ordered by
 * data dependencies, as Megatron queues its all-to-alls on the GPU stream.
 * Each exchange is framed by two ordering tasks (exchange_rows()) and each
 * stage waits for the one before, so a stage's buffers come to exist only
 * after the previous stage's are gone: the peaks are those of the stages in
 * turn (scheduler/model/memory_model.c), as with a collective on a stream and a
 * caching allocator.
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

enum { TAG_COUNTS, TAG_DISPATCH, TAG_PROBS, TAG_COMBINE, TAG_DOUT, TAG_DX, TAG_DPROBS };

/* after: a task the sort waits for, or NULL. */
static int submit_sort_rows(struct rmoe_layer *L, const struct rmoe_a2a_plan *p, enum rmoe_sort_direction direction,
                            int64_t width, starpu_data_handle_t *per_peer, starpu_data_handle_t sorted,
                            const char *name, struct starpu_task *after)
{
	struct rmoe_task_opts o = rmoe_opts(L, name, 0);
	o.after = after;
	return rmoe_insert_sort_chunks(&o, direction, width, p->N, L->e_local, p->chunk_rows, per_peer, sorted);
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
	/* Staggered as NCCL's all-to-all posts its peers: rank me sends to
	 * me + 1, me + 2, ... and receives from me - 1, me - 2, ..., so that the
	 * first transfers of all ranks load every link once, not one rank's
	 * adapter N - 1 times over while the others' idle. */
	for (int k = 1; k < N && !rc; k++) {
		const int q = (me - k + N) % N;
		if (in[q] && !(rc = rmoe_recv(L, in[q], q, tag)))
			rc = rmoe_pass_watch(L, pass, in[q], q, tag, 1, "the all-to-all's rows");
	}
	for (int k = 1; k < N && !rc; k++) {
		const int q = (me + k) % N;
		if (rows_out[q] > 0 && !(rc = rmoe_send(L, pass, out[q], q, tag, 1, NULL, NULL)))
			rc = rmoe_pass_watch(L, pass, out[q], q, tag, 0, "the all-to-all's rows");
	}
	in[me] = out[me];
	out[me] = NULL;
	if (!rc)
		rc = rmoe_pass_fence(L, pass, in, N, out, N, NULL, done, "a2a-done");
	/* Freed before the next stage's tasks start (release order, file head). */
	rmoe_a2a_release_sent(out, N);
	return rc;
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


/* A fence kept until the pass ends that ends once h is written: the next
 * stage's first tasks wait for it, so that its buffers come to exist only
 * after this stage's. NULL where h is. */
static int written(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t h, struct starpu_task **t)
{
	*t = NULL;
	return h ? rmoe_pass_fence(L, pass, &h, 1, NULL, 0, NULL, t, "a2a-stage") : 0;
}

/* Rows (width elements each: x or dy at the pair's token, topk K; one
 * probability, width 1, topk 1) of my pairs to the ranks of their experts,
 * sorted there by local expert into *sorted (NULL where no row comes), the
 * receive buffers released. The permutes wait for after; *next: the sort's
 * end, for the next stage. */
static int rows_to_experts(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_a2a_plan *p,
                           starpu_data_handle_t src, int64_t width, int64_t topk, size_t elsize, int phase,
                           struct starpu_task *after, struct starpu_task **done, starpu_data_handle_t *sorted,
                           struct starpu_task **next, const char *name)
{
	const int N = p->N;
	starpu_data_handle_t *block = calloc((size_t)(2 * N), sizeof(*block));
	starpu_data_handle_t *send = peers(block, N, 0), *recv = peers(block, N, 1);
	int rc = block ? 0 : rmoe_error(RMOE_ENOMEM, "out of host memory");
	*sorted = NULL;
	*next = NULL;
	for (int q = 0; q < N && !rc; q++)
		if (p->send_rows[q] > 0) {
			send[q] = rmoe_temp_vector(pass, p->send_rows[q] * width, elsize);
			rc = rmoe_a2a_gather(L, src, width, topk, p->send_first[q], p->send_rows[q], send[q], after, 0, name);
		}
	if (!rc)
		rc = exchange_rows(L, pass, p, send, p->send_rows, recv, p->recv_rows, width, elsize, phase, done);
	if (!rc && p->M > 0) {
		*sorted = rmoe_temp_vector(pass, p->M * width, elsize);
		rc = submit_sort_rows(L, p, RMOE_SORT_BY_EXPERT, width, recv, *sorted, "sort-by-expert", *done);
		/* Released before the fence the next stage waits for is
		 * submitted (release order, file head). */
		release_all(recv, N);
		if (!rc)
			rc = written(L, pass, *sorted, next);
	}
	if (block) {
		release_all(send, N);
		release_all(recv, N);
	}
	free(block);
	return rc;
}

/* Sorted rows (width elements) back toward the ranks of their tokens,
 * one buffer per source rank into ret: unsorted, or (weights, the sorted
 * probabilities) scaled by them on the way, through the plan's map. */
static int rows_to_tokens(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_a2a_plan *p,
                          starpu_data_handle_t sorted, int64_t width, size_t elsize, starpu_data_handle_t weights,
                          starpu_data_handle_t map, starpu_data_handle_t *ret, const char *name)
{
	if (p->M == 0)
		return 0;
	for (int q = 0; q < p->N; q++)
		if (p->recv_rows[q] > 0)
			ret[q] = rmoe_temp_vector(pass, p->recv_rows[q] * width, elsize);
	if (!weights)
		return submit_sort_rows(L, p, RMOE_UNSORT_TO_PEERS, width, ret, sorted, name, NULL);
	int rc = 0;
	for (int q = 0, first = 0; q < p->N && !rc; first += (int)p->recv_rows[q], q++)
		if (ret[q]) {
			struct rmoe_task_opts o = rmoe_opts(L, name, 0);
			struct rmoe_pair_slice s = {first, p->recv_rows[q], width, 1};
			rc = rmoe_insert_gather(&o, &s, sorted, map, weights, ret[q]);
		}
	return rc;
}

/* The received rows' place among the sorted ones (the plan's map), host
 * memory of the layer registered for this pass (counted in it). */
static starpu_data_handle_t unsort_map(struct rmoe_pass *pass, const struct rmoe_a2a_plan *p)
{
	return p->M > 0 ? rmoe_host_vector(pass, p->unsort_map, p->M, sizeof(int32_t)) : NULL;
}

/* Per-peer buffers of my pairs (rows of width) added at their tokens
 * (width H, topk K, unweighted) or pairs (width 1, topk 1). */
static int add_at_pairs(struct rmoe_layer *L, const struct rmoe_a2a_plan *p, starpu_data_handle_t *back, int64_t width,
                        int64_t topk, starpu_data_handle_t dst, const char *name)
{
	int rc = 0;
	for (int q = 0; q < p->N && !rc; q++)
		if (p->send_rows[q] > 0) {
			struct rmoe_task_opts o = rmoe_opts(L, name, 0);
			struct rmoe_pair_slice s = {p->send_first[q], p->send_rows[q], width, topk};
			rc = rmoe_insert_scatter_add(&o, &s, back[q], L->h_pair_order, NULL, dst);
		}
	return rc;
}

int rmoe_alltoall_megatron_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y)
{
	int rc = rmoe_a2a_plan_build(L, pass);
	if (rc)
		return rc;
	const struct rmoe_a2a_plan *p = L->a2a;
	const int N = p->N;
	starpu_data_handle_t *block = calloc((size_t)(2 * N), sizeof(*block));
	if (!block)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	starpu_data_handle_t *ret = peers(block, N, 0), *back = peers(block, N, 1);
	struct starpu_task *done = NULL, *next = NULL;
	starpu_data_handle_t xs = NULL, gs = NULL, map = unsort_map(pass, p);
	/* dispatch: the rows, then the probabilities beside them */
	rc = rows_to_experts(L, pass, p, L->h_x, L->H, L->K, L->act, TAG_DISPATCH, NULL, &done, &xs, &next, "permute");
	if (!rc)
		rc = rows_to_experts(L, pass, p, L->h_topk_w, 1, 1, sizeof(float), TAG_PROBS, next, &done, &gs, &next,
		                     "permute-probs");
	if (!rc && p->M > 0) {
		starpu_data_handle_t work = rmoe_act_vector(pass, L, p->M * 3 * L->F);
		starpu_data_handle_t outs = rmoe_act_vector(pass, L, p->M * L->H);
		struct rmoe_expert_shape es = {L->H, L->F, L->e_local, p->M, p->rows_per_expert};
		struct rmoe_task_opts o = rmoe_opts(L, "expert-ffn", 0);
		o.after = next;
		rc = rmoe_insert_expert_ffn(&o, &es, xs, L->h_w_part, work, outs);
		starpu_data_unregister_submit(xs);
		starpu_data_unregister_submit(work);
		xs = NULL;
		/* combine preprocess: scaled by the probabilities, unsorted */
		if (!rc)
			rc = rows_to_tokens(L, pass, p, outs, L->H, L->act, gs, map, ret, "unsort");
		starpu_data_unregister_submit(outs);
	}
	if (xs)
		starpu_data_unregister_submit(xs);
	if (gs)
		starpu_data_unregister_submit(gs);
	if (map)
		starpu_data_unregister_submit(map);
	if (!rc)
		rc = exchange_rows(L, pass, p, ret, p->recv_rows, back, p->send_rows, L->H, L->act, TAG_COMBINE, &done);
	/* combine postprocess: the unpermute, without probabilities */
	if (!rc)
		rc = add_at_pairs(L, p, back, L->H, L->K, y, "unpermute");
	release_all(ret, N);
	release_all(back, N);
	free(block);
	return rc;
}

/* The weighted SwiGLU's backward on the sorted rows, after the task after:
 * the probabilities gs applied, their gradients produced into *dgs, the
 * rows' dx left over xs (the pair-weighted kernel, identity pair order). */
static int expert_backward(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_expert_shape *es,
                           starpu_data_handle_t xs, starpu_data_handle_t dys, starpu_data_handle_t gs,
                           starpu_data_handle_t work, struct starpu_task *after, starpu_data_handle_t *dgs)
{
	starpu_data_handle_t order = rmoe_a2a_identity(L, es->rows);
	*dgs = rmoe_temp_vector(pass, es->rows, sizeof(float));
	/* The kernel writes every row's dg, but StarPU reads a buffer that a
	 * task updates (STARPU_RW): it must hold values first. */
	struct rmoe_task_opts o = rmoe_opts(L, "zero-dg-rows", 0);
	o.after = after;
	int rc = rmoe_insert_zero(&o, es->rows, *dgs);
	o = rmoe_opts(L, "expert-bwd", 0);
	if (!rc)
		rc = rmoe_insert_expert_bwd_pairs(&o, es, 0, 1, 0, xs, dys, L->h_w_part, order, gs, work, NULL, *dgs,
		                                  L->h_dw_part);
	starpu_data_unregister_submit(order);
	return rc;
}

/* Megatron's backward (file head): the recompute, then the reverse path. */
int rmoe_alltoall_megatron_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                                    starpu_data_handle_t dx)
{
	const struct rmoe_a2a_plan *p;
	int rc = rmoe_a2a_plan_get(L, &p);
	if (rc)
		return rc;
	const int N = p->N;
	const size_t f32 = sizeof(float);
	starpu_data_handle_t *block = calloc((size_t)(4 * N), sizeof(*block));
	if (!block)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	starpu_data_handle_t *dxsend = peers(block, N, 0), *dxback = peers(block, N, 1);
	starpu_data_handle_t *dgsend = peers(block, N, 2), *dgback = peers(block, N, 3);
	/* dg arrives as additions at the pairs (scatter-add): from zero. */
	rc = rmoe_pass_zero(L, NULL, L->h_dg, L->T * L->K, 0, "zero-dg");
	if (!rc && p->M == 0)
		rc = rmoe_pass_zero(L, NULL, L->h_dw_part, L->part_floats, 0, "zero-grad");
	/* The identity pair order of the sorted rows (K = 1: row i is pair i,
	 * its probability gs[i], its gradient dgs[i]). */
	pass->resident += 4 * p->M;
	if (!rc)
		rc = rmoe_a2a_identity_grow(L, p->M);

	struct starpu_task *done = NULL, *next = NULL;
	starpu_data_handle_t xs = NULL, gs = NULL, dys = NULL, work = NULL, dgs = NULL;
	/* The recompute: dispatch of the rows and probabilities, the experts
	 * up to the SwiGLU output (what autograd keeps); no combine. */
	if (!rc)
		rc = rows_to_experts(L, pass, p, L->h_x, L->H, L->K, L->act, TAG_DISPATCH, NULL, &done, &xs, &next,
		                     "permute");
	if (!rc)
		rc = rows_to_experts(L, pass, p, L->h_topk_w, 1, 1, f32, TAG_PROBS, next, &done, &gs, &next,
		                     "permute-probs");
	struct rmoe_expert_shape es = {L->H, L->F, L->e_local, p->M, p->rows_per_expert};
	if (!rc && p->M > 0) {
		work = rmoe_act_vector(pass, L, p->M * 4 * L->F);
		struct rmoe_task_opts o = rmoe_opts(L, "recompute", 0);
		o.after = next;
		rc = rmoe_insert_expert_ffn(&o, &es, xs, L->h_w_part, work, NULL);
		if (!rc)
			rc = written(L, pass, work, &next);
	}
	/* unpermute backward (no probabilities: dy at each pair's token),
	 * the combine's all-to-all backward, the unsort's backward */
	if (!rc)
		rc = rows_to_experts(L, pass, p, dy, L->H, L->K, L->act, TAG_DOUT, next, &done, &dys, &next,
		                     "unpermute-bwd");
	if (!rc && p->M > 0)
		rc = expert_backward(L, pass, &es, xs, dys, gs, work, next, &dgs);
	for (starpu_data_handle_t *h = (starpu_data_handle_t[]){dys, gs, work}, *end = h + 3; h < end; h++)
		if (*h)
			starpu_data_unregister_submit(*h);
	/* the sort's backward: dx rows and the probabilities' gradients back */
	if (!rc)
		rc = rows_to_tokens(L, pass, p, xs, L->H, L->act, NULL, NULL, dxsend, "unsort");
	if (!rc)
		rc = rows_to_tokens(L, pass, p, dgs, 1, f32, NULL, NULL, dgsend, "unsort-dprobs");
	if (xs)
		starpu_data_unregister_submit(xs);
	if (dgs)
		starpu_data_unregister_submit(dgs);
	if (!rc)
		rc = exchange_rows(L, pass, p, dxsend, p->recv_rows, dxback, p->send_rows, L->H, L->act, TAG_DX, &done);
	/* the permute's backward: the rows' dx summed over k into dx */
	if (!rc)
		rc = add_at_pairs(L, p, dxback, L->H, L->K, dx, "unpermute-dx");
	release_all(dxback, N);
	if (!rc)
		rc = exchange_rows(L, pass, p, dgsend, p->recv_rows, dgback, p->send_rows, 1, f32, TAG_DPROBS, &done);
	if (!rc)
		rc = add_at_pairs(L, p, dgback, 1, 1, L->h_dg, "unpermute-dprobs");
	release_all(dxsend, N);
	release_all(dgsend, N);
	release_all(dgback, N);
	free(block);
	return rc;
}
