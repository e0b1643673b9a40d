/* The all-to-all baselines, in the style of Megatron-LM's dispatcher (paper
 * Fig. 2): permute and top-k-expand the tokens by destination, exchange
 * counts, then rows (all-to-all as point-to-point StarPU-MPI transfers),
 * sort by local expert, grouped SwiGLU, unsort, all-to-all back, weighted
 * unpermute. Its buffers hold all T*K routed rows at once: that is the peak
 * the ring removes. Both share this forward; the backwards differ.
 *
 * a2a-megatron (RMOE_DISPATCH_ALLTOALL_MEGATRON) follows Megatron's
 * MoE-layer recomputation: the whole block is run forward again (dispatch,
 * experts keeping their intermediates, combine back to the source ranks),
 * then the reverse path: unpermute backward (dg and the weighted output
 * gradients), all-to-all, sort, preweighted expert backward (a separate dx
 * rows buffer: 3H + 3F per row live, and the kept outputs), unsort,
 * all-to-all back, unpermute into dx.
 *
 * a2a (RMOE_DISPATCH_ALLTOALL) is the strongest all-to-all we could write,
 * with the ring's kernel discipline (§3.3): the x rows of my pairs go to
 * their experts' ranks and are sorted there, then the dy rows (unweighted),
 * then the routing weights (one float per row); the pair-weighted expert
 * backward recomputes from x, applies the weight and produces dg in the
 * kernel, and leaves the rows' dx over the sorted x rows (2H + 4F per row
 * live, as a ring hop); those and the dg go back, added at their tokens and
 * pairs. Each kind of row is sorted before the next is exchanged, so the
 * stages' buffers do not coexist.
 *
 * Buffers are released as soon as their last task is submitted, as a
 * caching allocator would reuse them.
 *
 * Only the expert counts reach the host (plan_build): it sizes the buffers
 * with them, as Megatron's dispatcher synchronises on its "tokens per
 * expert". Everything after them is submitted at once, the row exchanges
 * as StarPU-MPI requests ordered by data dependencies, as Megatron queues
 * its all-to-alls on the GPU stream: a rank's expert GEMMs start once its
 * rows have arrived, never after a host round trip. Each exchange is framed
 * by two ordering tasks (exchange()) so that a stage's buffers still come
 * to exist only after the previous stage's are gone: the peaks are those of
 * the stages in turn (scheduler/memory_model.c), as with a collective on a
 * stream and a caching allocator.
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

#include "rmoe_dispatch.h"

/* TAG_DY, TAG_G and TAG_DG: the lean backward's. */
enum { TAG_COUNTS, TAG_DISPATCH, TAG_COMBINE, TAG_DOUT, TAG_DX, TAG_DY, TAG_G, TAG_DG };

/* Who sends what to whom, from every rank's expert counts. */
struct a2a_plan {
	int N, me;
	int64_t *send_first, *send_rows;  /* [N] my pairs routed to partition q */
	int64_t *recv_rows;               /* [N] q's pairs routed to my partition */
	int64_t *chunk_rows;              /* [N * e_local] rows of (peer q, local expert e) */
	int64_t *rows_per_expert;         /* [e_local] over all peers */
	int64_t M;                        /* rows my experts compute */
	int32_t *peer_counts;             /* [N * E] */
};

/* The int64 arrays share one allocation, send_first's. */
static void plan_free(struct a2a_plan *p)
{
	free(p->send_first);
	free(p->peer_counts);
}

/* Exchange expert counts (the "tokens per expert" all-to-all): every rank
 * sends its counts to every other. The host needs them to size buffers. */
static int plan_build(struct rmoe_layer *L, struct rmoe_pass *pass, struct a2a_plan *p)
{
	const int N = L->N, me = L->ctx->rank;
	const int64_t el = L->e_local;
	memset(p, 0, sizeof(*p));
	p->N = N;
	p->me = me;
	p->send_first = calloc((size_t)(3 * N + N * el + el), sizeof(int64_t));
	p->peer_counts = calloc((size_t)(N * L->E), sizeof(int32_t));
	if (!p->send_first || !p->peer_counts)
		return rmoe_error(RMOE_ENOMEM, "out of host memory for the all-to-all plan");
	p->send_rows = p->send_first + N;
	p->recv_rows = p->send_rows + N;
	p->chunk_rows = p->recv_rows + N;
	p->rows_per_expert = p->chunk_rows + N * el;

	int rc = rmoe_exchange_counts(L, pass, pass->tag_base + TAG_COUNTS, p->peer_counts);
	if (rc)
		return rc;

	for (int q = 0; q < N; q++) {
		p->send_first[q] = rmoe_pairs_first(L->expert_offsets, q * el);
		p->send_rows[q] = rmoe_pairs_count(L->expert_offsets, q * el, el);
		for (int64_t e = 0; e < el; e++) {
			int64_t c = p->peer_counts[(int64_t)q * L->E + me * el + e];
			p->chunk_rows[q * el + e] = c;
			p->recv_rows[q] += c;
			p->rows_per_expert[e] += c;
			p->M += c;
		}
	}
	return 0;
}

/* after: a task the sort waits for, or NULL. */
static int submit_sort_rows(struct rmoe_layer *L, const struct a2a_plan *p, enum rmoe_sort_direction direction,
                            int64_t width, starpu_data_handle_t *per_peer, starpu_data_handle_t sorted,
                            const char *name, struct starpu_task *after)
{
	struct rmoe_task_opts o = rmoe_opts(L, name, 0);
	o.after = after;
	return rmoe_insert_sort_chunks(&o, direction, width, p->N, L->e_local, p->chunk_rows, per_peer, sorted);
}

static int submit_sort(struct rmoe_layer *L, const struct a2a_plan *p, enum rmoe_sort_direction direction,
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
static int exchange_rows(struct rmoe_layer *L, struct rmoe_pass *pass, const struct a2a_plan *p,
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
static int exchange(struct rmoe_layer *L, struct rmoe_pass *pass, const struct a2a_plan *p,
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
static int dispatch_compute_combine(struct rmoe_layer *L, struct rmoe_pass *pass, const struct a2a_plan *p,
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

int rmoe_alltoall_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y)
{
	struct a2a_plan p;
	struct starpu_task *done = NULL;
	int rc = plan_build(L, pass, &p);
	starpu_data_handle_t *back = calloc((size_t)L->N, sizeof(*back));
	if (!rc && !back)
		rc = rmoe_error(RMOE_ENOMEM, "out of host memory");
	if (!rc)
		rc = dispatch_compute_combine(L, pass, &p, back, NULL, NULL, &done);
	/* combine postprocess: weighted unpermute into y */
	for (int q = 0; q < L->N && !rc; q++)
		if (p.send_rows[q] > 0)
			rc = rmoe_pass_scatter_add(L, &L->own, back[q], p.send_first[q], p.send_rows[q], 1, y, 0,
			                             "unpermute");
	release_all(back, L->N);
	free(back);
	plan_free(&p);
	return rc;
}

/* Megatron's backward (file head): recompute, then the reverse path. */
int rmoe_alltoall_megatron_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                                    starpu_data_handle_t dx)
{
	const int N = L->N;
	struct a2a_plan p;
	int rc = plan_build(L, pass, &p);
	starpu_data_handle_t *block = calloc((size_t)(5 * N), sizeof(*block));
	starpu_data_handle_t *back = peers(block, N, 0), *dout = peers(block, N, 1), *drecv = peers(block, N, 2);
	starpu_data_handle_t *dxsend = peers(block, N, 3), *dxback = peers(block, N, 4);
	if (!rc && !block)
		rc = rmoe_error(RMOE_ENOMEM, "out of host memory");

	/* Recompute of the whole block, keeping what autograd would save. */
	starpu_data_handle_t sorted = NULL, work = NULL;
	struct starpu_task *done = NULL;
	if (!rc)
		rc = dispatch_compute_combine(L, pass, &p, back, &sorted, &work, &done);

	/* combine postprocess backward: dg = <dy, out>, dout = g dy */
	for (int q = 0; q < N && !rc; q++)
		if (p.send_rows[q] > 0) {
			dout[q] = rmoe_act_vector(pass, L, p.send_rows[q] * L->H);
			rc = submit_unpermute_bwd(L, dy, back[q], p.send_first[q], p.send_rows[q], dout[q], done);
		}
	release_all(back, N);
	if (!rc)
		rc = exchange(L, pass, &p, dout, p.send_rows, drecv, p.recv_rows, TAG_DOUT, &done);

	if (!rc && p.M > 0) {
		starpu_data_handle_t dsorted = rmoe_act_vector(pass, L, p.M * L->H);
		rc = submit_sort(L, &p, RMOE_SORT_BY_EXPERT, drecv, dsorted, "sort-by-expert", done);
		release_all(drecv, N);
		starpu_data_handle_t dxs = rmoe_act_vector(pass, L, p.M * L->H);
		struct rmoe_task_opts o = rmoe_opts(L, "expert-bwd", 0);
		struct rmoe_expert_shape es = {L->H, L->F, L->e_local, p.M, p.rows_per_expert};
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
			if (p.recv_rows[q] > 0)
				dxsend[q] = rmoe_act_vector(pass, L, p.recv_rows[q] * L->H);
		if (!rc)
			rc = submit_sort(L, &p, RMOE_UNSORT_TO_PEERS, dxsend, dxs, "unsort", NULL);
		starpu_data_unregister_submit(dxs);
	} else if (!rc) {
		rc = rmoe_pass_zero(L, NULL, L->h_dw_part, L->part_floats, 0, "zero-grad");
	}
	if (sorted)
		starpu_data_unregister_submit(sorted);
	if (work)
		starpu_data_unregister_submit(work);
	release_all(drecv, N);
	if (!rc)
		rc = exchange(L, pass, &p, dxsend, p.recv_rows, dxback, p.send_rows, TAG_DX, &done);
	/* dispatch preprocess backward: unpermute (sum over k) into dx */
	for (int q = 0; q < N && !rc; q++)
		if (p.send_rows[q] > 0)
			rc = rmoe_pass_scatter_add(L, &L->own, dxback[q], p.send_first[q], p.send_rows[q], 0, dx, 0,
			                             "unpermute-dx");
	release_all(dxsend, N);
	release_all(dxback, N);
	free(block);
	plan_free(&p);
	return rc;
}


/* ---- the lean backward ------------------------------------------------------------------------ */

/* A fence kept until the pass ends that ends once h is written: the next
 * stage's first tasks wait for it, so that its buffers come to exist only
 * after the previous stage's sort. NULL where h is. */
static int written(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t h, struct starpu_task **t)
{
	*t = NULL;
	return h ? rmoe_pass_fence(L, pass, &h, 1, NULL, 0, NULL, t, "a2a-sorted") : 0;
}

/* My pairs' rows per destination: width elements of src per pair (x or dy
 * at the pair's token: topk K; one routing weight: topk 1, width 1, pair p
 * at index p), after the task after. */
static int gather_per_peer(struct rmoe_layer *L, struct rmoe_pass *pass, const struct a2a_plan *p,
                           starpu_data_handle_t src, int64_t width, int64_t topk, size_t elsize,
                           starpu_data_handle_t *send, struct starpu_task *after, const char *name)
{
	int rc = 0;
	for (int q = 0; q < p->N && !rc; q++)
		if (p->send_rows[q] > 0) {
			struct rmoe_task_opts o = rmoe_opts(L, name, 0);
			o.after = after;
			struct rmoe_pair_slice s = {p->send_first[q], p->send_rows[q], width, topk};
			send[q] = rmoe_temp_vector(pass, p->send_rows[q] * width, elsize);
			rc = rmoe_insert_gather(&o, &s, src, L->h_pair_order, NULL, send[q]);
		}
	return rc;
}

/* Rows (width elements each) of my pairs to the ranks of their experts,
 * sorted there by local expert into *sorted (NULL where no row comes), the
 * receive buffers released. The gathers wait for after; *next: the sort's
 * end, for the next stage. */
static int rows_to_experts(struct rmoe_layer *L, struct rmoe_pass *pass, const struct a2a_plan *p,
                           starpu_data_handle_t src, int64_t width, int64_t topk, size_t elsize, int phase,
                           struct starpu_task *after, struct starpu_task **done, starpu_data_handle_t *sorted,
                           struct starpu_task **next, const char *gather_name)
{
	const int N = p->N;
	starpu_data_handle_t *block = calloc((size_t)(2 * N), sizeof(*block));
	starpu_data_handle_t *send = peers(block, N, 0), *recv = peers(block, N, 1);
	int rc = block ? 0 : rmoe_error(RMOE_ENOMEM, "out of host memory");
	*sorted = NULL;
	*next = NULL;
	if (!rc)
		rc = gather_per_peer(L, pass, p, src, width, topk, elsize, send, after, gather_name);
	if (!rc)
		rc = exchange_rows(L, pass, p, send, p->send_rows, recv, p->recv_rows, width, elsize, phase, done);
	if (!rc && p->M > 0) {
		*sorted = rmoe_temp_vector(pass, p->M * width, elsize);
		rc = submit_sort_rows(L, p, RMOE_SORT_BY_EXPERT, width, recv, *sorted, "sort-by-expert", *done);
		/* Released before the fence that the next stage waits for is
		 * submitted (release order, file head). */
		release_all(recv, N);
		if (!rc)
			rc = written(L, pass, *sorted, next);
	}
	release_all(send, N);
	release_all(recv, N);
	free(block);
	return rc;
}

/* Sorted rows back toward the ranks of their tokens: unsorted into ret[q],
 * one buffer per source rank, before the caller releases sorted; the
 * caller's exchange sends them. */
static int rows_to_tokens(struct rmoe_layer *L, struct rmoe_pass *pass, const struct a2a_plan *p,
                          starpu_data_handle_t sorted, int64_t width, size_t elsize, starpu_data_handle_t *ret,
                          const char *name)
{
	if (p->M == 0)
		return 0;
	for (int q = 0; q < p->N; q++)
		if (p->recv_rows[q] > 0)
			ret[q] = rmoe_temp_vector(pass, p->recv_rows[q] * width, elsize);
	return submit_sort_rows(L, p, RMOE_UNSORT_TO_PEERS, width, ret, sorted, name, NULL);
}

/* 0, 1, ..., M-1: the pair order of the sorted rows, whose pair i is row i
 * (its routing weight gs[i], its dg dgs[i]). Host memory of the layer,
 * registered for this pass (counted in it). */
static int identity_order(struct rmoe_layer *L, struct rmoe_pass *pass, int64_t M, starpu_data_handle_t *h)
{
	if (M > L->iota_n) {
		int32_t *v = realloc(L->iota, (size_t)M * sizeof(int32_t));
		if (!v)
			return rmoe_error(RMOE_ENOMEM, "out of host memory for %lld rows' pair order", (long long)M);
		for (int64_t i = L->iota_n; i < M; i++)
			v[i] = (int32_t)i;
		L->iota = v;
		L->iota_n = M;
	}
	*h = rmoe_host_vector(pass, L->iota, M, sizeof(int32_t));
	return 0;
}

/* The expert stage of the lean backward on the sorted rows, after the
 * task after (the last sort): recompute from xs, then the pair-weighted
 * backward with the identity pair order (K = 1), the routing weights gs and
 * the dg of each row into *dgs; the rows' dx left in xs. No rows: the
 * weight gradient is zero. */
static int expert_stage(struct rmoe_layer *L, struct rmoe_pass *pass, const struct a2a_plan *p,
                        starpu_data_handle_t xs, starpu_data_handle_t dys, starpu_data_handle_t gs,
                        struct starpu_task *after, starpu_data_handle_t *dgs)
{
	if (p->M == 0)
		return rmoe_pass_zero(L, NULL, L->h_dw_part, L->part_floats, 0, "zero-grad");
	starpu_data_handle_t order = NULL, work = rmoe_act_vector(pass, L, p->M * 4 * L->F);
	*dgs = rmoe_temp_vector(pass, p->M, sizeof(float));
	int rc = identity_order(L, pass, p->M, &order);
	/* The recompute waits for the last sort: its workspace comes to exist
	 * after the exchanges' buffers are gone. */
	struct rmoe_expert_shape es = {L->H, L->F, L->e_local, p->M, p->rows_per_expert};
	struct rmoe_task_opts o = rmoe_opts(L, "recompute", 0);
	o.after = after;
	if (!rc)
		rc = rmoe_insert_expert_ffn(&o, &es, xs, L->h_w_part, work, NULL);
	/* The kernel writes every row's dg, but StarPU reads a buffer that a
	 * task updates (STARPU_RW): it must hold values first. */
	o = rmoe_opts(L, "zero-dg-rows", 0);
	o.after = after;
	if (!rc)
		rc = rmoe_insert_zero(&o, p->M, *dgs);
	o = rmoe_opts(L, "expert-bwd", 0);
	if (!rc)
		rc = rmoe_insert_expert_bwd_pairs(&o, &es, 0, 1, 0, xs, dys, L->h_w_part, order, gs, work, NULL, *dgs,
		                                  L->h_dw_part);
	if (order)
		starpu_data_unregister_submit(order);
	starpu_data_unregister_submit(work);
	return rc;
}

/* The ring's kernel discipline in an all-to-all (file head): x, dy and g
 * rows of my pairs go to the experts' ranks, each kind sorted by local
 * expert before the next is exchanged; the pair-weighted expert backward
 * (recompute from x, routing weight applied in the kernel, dg produced
 * there) leaves the rows' dx over the sorted x rows; those and the dg go
 * back, dx rows added at their tokens unweighted (the weight is in), dg
 * values at their pairs. Per computed row 2H + 4F live in the expert
 * stage, as a ring hop's, where Megatron's graph keeps 3H + 3F and the
 * recomputed outputs. */
int rmoe_alltoall_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                           starpu_data_handle_t dx)
{
	const int N = L->N;
	const size_t f32 = sizeof(float);
	struct a2a_plan p;
	int rc = plan_build(L, pass, &p);
	starpu_data_handle_t *block = calloc((size_t)(4 * N), sizeof(*block));
	starpu_data_handle_t *dxsend = peers(block, N, 0), *dxback = peers(block, N, 1);
	starpu_data_handle_t *dgsend = peers(block, N, 2), *dgback = peers(block, N, 3);
	if (!rc && !block)
		rc = rmoe_error(RMOE_ENOMEM, "out of host memory");

	/* dg arrives as additions at the pairs (scatter-add): from zero. */
	if (!rc)
		rc = rmoe_pass_zero(L, NULL, L->h_dg, L->T * L->K, 0, "zero-dg");

	struct starpu_task *done = NULL, *next = NULL;
	starpu_data_handle_t xs = NULL, dys = NULL, gs = NULL;
	if (!rc)
		rc = rows_to_experts(L, pass, &p, L->h_x, L->H, L->K, L->act, TAG_DISPATCH, NULL, &done, &xs, &next,
		                     "permute");
	if (!rc)
		rc = rows_to_experts(L, pass, &p, dy, L->H, L->K, L->act, TAG_DY, next, &done, &dys, &next,
		                     "permute-dy");
	if (!rc)
		rc = rows_to_experts(L, pass, &p, L->h_topk_w, 1, 1, f32, TAG_G, next, &done, &gs, &next,
		                     "permute-g");

	starpu_data_handle_t dgs = NULL;
	if (!rc)
		rc = expert_stage(L, pass, &p, xs, dys, gs, next, &dgs);
	if (dys)
		starpu_data_unregister_submit(dys);
	if (gs)
		starpu_data_unregister_submit(gs);
	if (!rc)
		rc = rows_to_tokens(L, pass, &p, xs, L->H, L->act, dxsend, "unsort");
	if (!rc)
		rc = rows_to_tokens(L, pass, &p, dgs, 1, f32, dgsend, "unsort-dg");
	if (xs)
		starpu_data_unregister_submit(xs);
	if (dgs)
		starpu_data_unregister_submit(dgs);
	if (!rc)
		rc = exchange_rows(L, pass, &p, dxsend, p.recv_rows, dxback, p.send_rows, L->H, L->act, TAG_DX, &done);
	/* dispatch preprocess backward: the rows' dx (weighted in the kernel)
	 * summed over k into dx */
	for (int q = 0; q < N && !rc; q++)
		if (p.send_rows[q] > 0)
			rc = rmoe_pass_scatter_add(L, &L->own, dxback[q], p.send_first[q], p.send_rows[q], 0, dx, 0,
			                             "unpermute-dx");
	release_all(dxback, N);
	if (!rc)
		rc = exchange_rows(L, pass, &p, dgsend, p.recv_rows, dgback, p.send_rows, 1, f32, TAG_DG, &done);
	/* each pair's dg at its index (width 1, topk 1) */
	for (int q = 0; q < N && !rc; q++)
		if (p.send_rows[q] > 0) {
			struct rmoe_task_opts o = rmoe_opts(L, "unpermute-dg", 0);
			struct rmoe_pair_slice s = {p.send_first[q], p.send_rows[q], 1, 1};
			rc = rmoe_insert_scatter_add(&o, &s, dgback[q], L->h_pair_order, NULL, L->h_dg);
		}
	release_all(dxsend, N);
	release_all(dgsend, N);
	release_all(dgback, N);
	free(block);
	plan_free(&p);
	return rc;
}
