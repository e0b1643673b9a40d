/* The helpers a pass is built with: temporaries, chunks, transfers, and the
 * "window" and "gate" under which its tasks are inserted.
 *
 * Window. StarPU starts any task whose data are ready: a worker idle while
 * hop h waits for its weights would gather the rows of hops h+1, h+2, ...
 * ahead of time, and each early gather keeps a hop's rows alive. That
 * prefetch buys nothing (gathers are cheap) and spends the memory the ring
 * exists to save. So the gathers of each chunk (a whole hop unless chunking
 * is on) wait for the expert task of the chunk before: one chunk's
 * intermediates at a time, §3.3. The expert tasks are kept (not destroyed
 * when they end) as dependency anchors until the pass ends.
 *
 * Gate. A ring adds each hop's partial (expert routing: the weight gradient;
 * token routing: outputs, dx, dg) into the accumulator arriving from the
 * left; the partial lives until then. That addition becomes the window too:
 * the next hop's gathers, partials and expert task wait for it, as the
 * paper's GPU waits at this synchronisation point (§3.1), so one partial and
 * one hop's rows exist at a time whatever the network does. The accumulator
 * left its neighbour a hop before the next weights (or tokens) did, so the
 * wait rarely costs anything. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_pass.h"

/* ---- buffers ------------------------------------------------------------------ */

starpu_data_handle_t rmoe_temp_vector(struct rmoe_pass *pass, int64_t n, size_t elsize)
{
	starpu_data_handle_t h;
	int64_t bytes = n * (int64_t)elsize;
	/* StarPU frees a temporary's main-memory buffer at once (the host
	 * cache, codelets/host_cache.c, keeps it), but keeps a device's in a
	 * cache that serves only an allocation of the same size: with row
	 * counts that differ from partition to partition every temporary would
	 * stay allocated until the device is full. Sizes in classes of an
	 * eighth of an octave (at most 12.5% over) make the next partition
	 * reuse them; host-only runs keep exact sizes. */
	if (starpu_cuda_worker_get_count() > 0)
		starpu_vector_data_register_allocsize(&h, -1, 0, (uint32_t)n, elsize, (size_t)rmoe_size_class(bytes));
	else
		starpu_vector_data_register(&h, -1, 0, (uint32_t)n, elsize);
	if (bytes > pass->largest_temporary)
		pass->largest_temporary = bytes;
	return h;
}

starpu_data_handle_t rmoe_node_vector(struct rmoe_pass *pass, int node, void *ptr, int64_t n, size_t elsize)
{
	if (pass && node == STARPU_MAIN_RAM)
		pass->resident += n * (int64_t)elsize;
	starpu_data_handle_t h;
	starpu_vector_data_register(&h, node, (uintptr_t)ptr, (uint32_t)n, elsize);
	return h;
}

starpu_data_handle_t rmoe_host_vector(struct rmoe_pass *pass, void *ptr, int64_t n, size_t elsize)
{
	return rmoe_node_vector(pass, STARPU_MAIN_RAM, ptr, n, elsize);
}

int rmoe_pass_hold(struct rmoe_pass *pass, starpu_data_handle_t h)
{
	if (pass->nheld == pass->capheld) {
		int cap = pass->capheld ? 2 * pass->capheld : 8;
		starpu_data_handle_t *a = realloc(pass->held, (size_t)cap * sizeof(*a));
		if (!a) {
			/* Not held: freed when its last user ends, which is also correct. */
			starpu_data_unregister_submit(h);
			return rmoe_error(RMOE_ENOMEM, "out of host memory");
		}
		pass->held = a;
		pass->capheld = cap;
	}
	pass->held[pass->nheld++] = h;
	return 0;
}

/* Destroys the pass's dependency anchors and unregisters the buffers it
 * holds; after every task has ended. */
static void pass_release(struct rmoe_pass *pass)
{
	for (int i = 0; i < pass->nanchors; i++)
		starpu_task_destroy(pass->anchors[i]);
	free(pass->anchors);
	pass->anchors = NULL;
	pass->nanchors = pass->capanchors = 0;
	pass->window = pass->gate = NULL;
	for (int i = 0; i < pass->nheld; i++)
		starpu_data_unregister(pass->held[i]);
	free(pass->held);
	pass->held = NULL;
	pass->nheld = pass->capheld = 0;
	for (int i = 0; i < pass->nwatched; i++)
		starpu_task_destroy(pass->watched[i].fence);
	free(pass->watched);
	pass->watched = NULL;
	pass->nwatched = pass->capwatched = 0;
}

int rmoe_pass_finish(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t *outs, int nouts)
{
	int rc;
	/* Waits for the outputs where they are: a device's stay there until
	 * the application reads them (unregistering an application's buffer,
	 * or rmoe_layer_get_grad_*, brings them home). */
	for (int i = 0; i < nouts; i++)
		if (outs[i]) {
			if ((rc = rmoe_acquire_bounded(outs[i], STARPU_ACQUIRE_NO_NODE, STARPU_R, "the pass's outputs")) ==
			    RMOE_EPEER)
				return rc;
			if (!rc)
				starpu_data_release_on_node(outs[i], STARPU_ACQUIRE_NO_NODE);
		}
	if ((rc = rmoe_wait_tasks("the pass's tasks and transfers")))
		return rc;
	/* A held relay buffer may still be in a send to the next rank, which
	 * no task count shows; unregistering would wait for it without bound.
	 * A write access waits for every earlier one, needs no initialised
	 * contents (a receive buffer the pass never filled) and, on no node,
	 * moves no data. */
	for (int i = 0; i < pass->nheld; i++) {
		rc = rmoe_acquire_bounded(pass->held[i], STARPU_ACQUIRE_NO_NODE, STARPU_W, "a relay buffer's last send");
		if (rc == RMOE_EPEER)
			return rc;
		if (!rc)
			starpu_data_release_on_node(pass->held[i], STARPU_ACQUIRE_NO_NODE);
	}
	pass_release(pass);
	/* A write access waits for the weights' last send; on no node it
	 * moves them nowhere (an access on main memory would invalidate the
	 * device's copy, and the next pass would upload all the weights). */
	if ((rc = rmoe_acquire_bounded(L->h_w_part, STARPU_ACQUIRE_NO_NODE, STARPU_RW, "the weights' last transfer")) ==
	    RMOE_EPEER)
		return rc;
	if (!rc)
		starpu_data_release_on_node(L->h_w_part, STARPU_ACQUIRE_NO_NODE);
	return 0;
}

/* Appends ", rank R on host H" (no comma first) to who[cap]; *n counts them. */
static void append_rank(char *who, size_t cap, size_t *used, int *n, const struct rmoe_topology *t, int rank)
{
	if (*used >= cap)
		return;
	const char *h = rmoe_topology_host(t, rank);
	*used += (size_t)snprintf(who + *used, cap - *used, "%srank %d on host %s", *n ? ", " : "", rank, h ? h : "?");
	(*n)++;
}

/* The peers of the earliest watched transfers (lowest tag) that have not
 * completed, with their hosts, into *rc; 0 when every watched transfer has
 * completed. Transfers of later tags may wait only because of those: an
 * exchange is posted once the one before it has completed. */
static int stalled_peers(const struct rmoe_layer *L, const struct rmoe_pass *pass, const char *why, int *rc)
{
	/* The status, not starpu_task_finished(), which takes only tasks that
	 * are waited for (detach = 0); read after a timeout, long past a race. */
#define PENDING(w) ((w)->fence->status != STARPU_TASK_FINISHED)
	const struct rmoe_watch *first = NULL;
	for (int i = 0; i < pass->nwatched; i++)
		if (PENDING(&pass->watched[i]) && (!first || pass->watched[i].tag < first->tag))
			first = &pass->watched[i];
	if (!first)
		return 0;
	const struct rmoe_topology *t = &L->ctx->topo;
	const char *my_host = rmoe_topology_host(t, L->ctx->rank);
	char who[256] = "";
	size_t used = 0;
	int n = 0;
	for (int i = 0; i < pass->nwatched; i++) {
		const struct rmoe_watch *w = &pass->watched[i];
		int seen = 0;
		for (int j = 0; j < i; j++)
			seen |= pass->watched[j].peer == w->peer && pass->watched[j].tag == w->tag && PENDING(&pass->watched[j]);
		if (w->tag == first->tag && !seen && PENDING(w))
			append_rank(who, sizeof(who), &used, &n, t, w->peer);
	}
	*rc = rmoe_error(RMOE_EPEER, "%s pass stalled waiting for %s exchanged with %s, this rank (%d on %s): %s",
	                 pass->backward ? "backward" : "forward", first->what, who, L->ctx->rank,
	                 my_host ? my_host : "?", why);
	return n;
#undef PENDING
}

int rmoe_pass_peer_named(const struct rmoe_layer *L, const struct rmoe_pass *pass, int rc)
{
	if (rc != RMOE_EPEER || L->N < 2)
		return rc;
	char why[512];
	snprintf(why, sizeof(why), "%s", rmoe_strerror(rc));
	const struct rmoe_topology *t = &L->ctx->topo;
	const char *my_host = rmoe_topology_host(t, L->ctx->rank);
	int missing[4], m = rmoe_wait_missing(missing, 4);
	if (m == 0)
		return rc;   /* a vote that completed as it timed out */
	if (m > 0) {
		/* A vote of all ranks: the ranks whose vote never came (lost,
		 * stuck in the pass before, or cut off), with their hosts. */
		char who[256] = "";
		size_t used = 0;
		int n = 0;
		for (int i = 0; i < m && i < 4; i++)
			append_rank(who, sizeof(who), &used, &n, t, missing[i]);
		return rmoe_error(RMOE_EPEER, "%s vote stalled waiting for %s%s, this rank (%d on %s): %s",
		                  pass->backward ? "backward" : "forward", who, m > 4 ? ", ..." : "", L->ctx->rank,
		                  my_host ? my_host : "?", why);
	}
	if (stalled_peers(L, pass, why, &rc))
		return rc;
	if (rmoe_dispatch_alltoall(L->dispatch))
		return rc;
	/* A ring hop waits for one rank only: the left neighbour, the sender
	 * of every relay this rank receives. When data stops, it is that rank
	 * or a rank before it on the ring that was lost. */
	const char *left_host = rmoe_topology_host(t, L->left);
	return rmoe_error(RMOE_EPEER,
	                  "%s pass stalled waiting for rank %d on host %s (node %d), the left neighbour whose relay "
	                  "this rank (%d on %s) receives: %s",
	                  pass->backward ? "backward" : "forward", L->left, left_host ? left_host : "?",
	                  t->node[L->left], L->ctx->rank, my_host ? my_host : "?", why);
}

/* ---- chunks ----------------------------------------------------------------------- */

/* The chunks of the pairs [first, first + total): at most max_rows rows
 * each (0: one), appended at c + *n. */
static int append_chunks(const struct rmoe_layer *L, const int64_t *offsets, int64_t e0, int64_t first,
                         int64_t total, int64_t max_rows, struct rmoe_chunk *c, int64_t *n)
{
	if (max_rows <= 0 || max_rows > total)
		max_rows = total;
	for (int64_t at = first; at < first + total; at += max_rows) {
		struct rmoe_chunk *k = &c[(*n)++];
		k->first = at;
		k->rows = first + total - at < max_rows ? first + total - at : max_rows;
		k->rows_per_expert = calloc((size_t)L->e_local, sizeof(int64_t));
		if (!k->rows_per_expert)
			return -1;
		for (int64_t e = 0; e < L->e_local; e++) {
			int64_t a = offsets[e0 + e], b = offsets[e0 + e + 1];
			int64_t s = a > at ? a : at, t = b < at + k->rows ? b : at + k->rows;
			k->rows_per_expert[e] = t > s ? t - s : 0;
		}
	}
	return 0;
}

int64_t rmoe_partition_chunks(const struct rmoe_layer *L, const int64_t *offsets, int p, int64_t max_rows,
                              struct rmoe_chunk **chunks)
{
	const int64_t e0 = (int64_t)p * L->e_local;
	const int64_t parts = L->cfg.partitions > 1 ? L->cfg.partitions : 1, per = L->e_local / parts;
	*chunks = NULL;
	if (rmoe_pairs_count(offsets, e0, L->e_local) == 0)
		return 0;
	/* Each of the rank's partitions (hops on one device) is chunked on its
	 * own: a chunk never spans two, and one's rows are gone before the
	 * next's are gathered (the window). */
	int64_t cap = 0;
	for (int64_t g = 0; g < parts; g++) {
		int64_t total = rmoe_pairs_count(offsets, e0 + g * per, per);
		int64_t m = max_rows > 0 && max_rows < total ? max_rows : total;
		cap += m > 0 ? (total + m - 1) / m : 0;
	}
	struct rmoe_chunk *c = calloc((size_t)cap, sizeof(*c));
	int64_t n = 0;
	int rc = c ? 0 : -1;
	for (int64_t g = 0; g < parts && !rc; g++)
		rc = append_chunks(L, offsets, e0, rmoe_pairs_first(offsets, e0 + g * per),
		                   rmoe_pairs_count(offsets, e0 + g * per, per), max_rows, c, &n);
	if (rc) {
		rmoe_chunks_free(c, n);
		return -1;
	}
	*chunks = c;
	return n;
}

void rmoe_chunks_free(struct rmoe_chunk *chunks, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		free(chunks[i].rows_per_expert);
	free(chunks);
}

/* ---- transfers -------------------------------------------------------------------------- */

int rmoe_send(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t h, int dest, int64_t tag,
              int prio, void (*done)(void *), void *arg)
{
	int ret = starpu_mpi_isend_detached_prio(h, dest, tag, prio, L->ctx->comm, done, arg);
	if (ret != 0)
		return rmoe_error(RMOE_ESTARPU, "starpu_mpi_isend_detached to rank %d (tag %lld) failed (%d)", dest,
		                  (long long)tag, ret);
	pass->bytes_sent += (int64_t)starpu_data_get_size(h);
	return 0;
}

int rmoe_recv(struct rmoe_layer *L, starpu_data_handle_t h, int src, int64_t tag)
{
	int ret = starpu_mpi_irecv_detached(h, src, tag, L->ctx->comm, NULL, NULL);
	if (ret != 0)
		return rmoe_error(RMOE_ESTARPU, "starpu_mpi_irecv_detached from rank %d (tag %lld) failed (%d)", src,
		                  (long long)tag, ret);
	return 0;
}

int rmoe_pass_watch(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t h, int peer, int64_t tag,
                    int received, const char *what)
{
	/* Without a timeout no wait gives up, so there is no stall to name: no
	 * task is added to the pass. */
	if (L->cfg.wait_timeout <= 0)
		return 0;
	if (pass->nwatched == pass->capwatched) {
		int cap = pass->capwatched ? 2 * pass->capwatched : 16;
		struct rmoe_watch *a = realloc(pass->watched, (size_t)cap * sizeof(*a));
		if (!a)
			return rmoe_error(RMOE_ENOMEM, "out of host memory");
		pass->watched = a;
		pass->capwatched = cap;
	}
	struct rmoe_task_opts o = rmoe_opts(L, "watch", 0);
	struct starpu_task *t = NULL;
	o.kept = &t;
	/* After a receive, a read: it waits for that writer only. After a
	 * send, a write waits for the send's read; the buffer's later users
	 * (its unregistration) come after the send anyway. */
	int rc = rmoe_insert_fence(&o, &h, received ? 1 : 0, &h, received ? 0 : 1);
	if (!rc)
		pass->watched[pass->nwatched++] = (struct rmoe_watch){t, peer, tag, what};
	return rc;
}

int rmoe_exchange_counts(struct rmoe_layer *L, struct rmoe_pass *pass, int64_t tag, int32_t *all)
{
	const int N = L->N, me = L->ctx->rank;
	starpu_data_handle_t *hc = calloc((size_t)N, sizeof(*hc));
	if (!hc)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	int rc = 0;
	for (int q = 0; q < N && !rc; q++) {
		if (q == me)
			continue;
		hc[q] = rmoe_host_vector(NULL, all + (int64_t)q * L->E, L->E, sizeof(int32_t));
		rc = rmoe_send(L, pass, L->h_counts, q, tag, 0, NULL, NULL);
		if (!rc)
			rc = rmoe_recv(L, hc[q], q, tag);
		if (!rc)
			rc = rmoe_pass_watch(L, pass, hc[q], q, tag, 1, "the expert counts");
	}
	/* Unregistering waits for each receive; a bounded wait first, so that a
	 * dead peer gives RMOE_EPEER (its handle is then left registered). */
	for (int q = 0; q < N; q++)
		if (hc[q] && !rc) {
			int wrc = rmoe_wait_data(hc[q]);
			if (wrc == RMOE_EPEER) {
				free(hc);
				return wrc;
			}
			rc = wrc;
		}
	for (int q = 0; q < N; q++)
		if (hc[q])
			starpu_data_unregister(hc[q]);
	free(hc);
	if (rc)
		return rc;
	memcpy(all + (int64_t)me * L->E, L->expert_counts, (size_t)L->E * sizeof(int32_t));
#ifdef STARPU_SIMGRID
	/* What was sent is synthetic; each rank draws every rank's counts
	 * itself, so the plans agree whatever the transfers carried. */
	for (int q = 0; q < N; q++)
		rmoe_sim_expert_counts(L->T, L->K, L->E, q, all + (int64_t)q * L->E);
#endif
	return 0;
}

/* ---- tasks under the window and the gate ---------------------------------------------------- */

struct rmoe_task_opts rmoe_opts(const struct rmoe_layer *L, const char *name, int prio)
{
	return (struct rmoe_task_opts){.name = name, .prio = prio, .deterministic = L->cfg.deterministic};
}

/* Room for one more anchor before a task that becomes one is submitted, so
 * that keeping it cannot fail afterwards. */
static int reserve_anchor(struct rmoe_pass *pass)
{
	if (pass->nanchors < pass->capanchors)
		return 0;
	int cap = pass->capanchors ? 2 * pass->capanchors : 16;
	struct starpu_task **a = realloc(pass->anchors, (size_t)cap * sizeof(*a));
	if (!a)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	pass->anchors = a;
	pass->capanchors = cap;
	return 0;
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

int rmoe_pass_scatter_add(struct rmoe_layer *L, const struct rmoe_routing *rt, starpu_data_handle_t rows,
                          int64_t first, int64_t count, int weighted, starpu_data_handle_t dst, int prio,
                          const char *name)
{
	struct rmoe_task_opts o = rmoe_opts(L, name, prio);
	struct rmoe_pair_slice s = {first, count, L->H, L->K};
	return rmoe_insert_scatter_add(&o, &s, rows, rt->pair_order, weighted ? rt->topk_w : NULL, dst);
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

int rmoe_pass_accumulate(struct rmoe_pass *gate_pass, starpu_data_handle_t src, starpu_data_handle_t dst,
                         int64_t count, int prio, const char *name)
{
	struct rmoe_task_opts o = {.name = name, .prio = prio};
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

int rmoe_pass_zero(struct rmoe_pass *pass, starpu_data_handle_t dst, int64_t count, int prio, const char *name)
{
	struct rmoe_task_opts o = {.name = name, .prio = prio, .after = pass ? pass->window : NULL};
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

/* ---- one chunk of a hop ------------------------------------------------------------------------ */

int rmoe_chunk_forward(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_routing *rt,
                       starpu_data_handle_t x, starpu_data_handle_t w, const struct rmoe_chunk *c,
                       starpu_data_handle_t acc, int prio, int hop)
{
	const int64_t rows = c->rows;
	starpu_data_handle_t xg = rmoe_act_vector(pass, L, rows * L->H);
	starpu_data_handle_t work = rmoe_act_vector(pass, L, rows * 3 * L->F);
	starpu_data_handle_t out = rmoe_act_vector(pass, L, rows * L->H);
	int rc = rmoe_pass_gather(L, pass, rt, x, c->first, rows, 0, xg, prio, rmoe_task_name("gather", hop));
	if (!rc)
		rc = rmoe_pass_expert_ffn(L, pass, xg, w, L->e_local, L->F, c->rows_per_expert, rows, work, out, prio,
		                          rmoe_task_name("expert-ffn", hop));
	if (!rc)
		rc = rmoe_pass_scatter_add(L, rt, out, c->first, rows, 1, acc, prio, rmoe_task_name("scatter-add", hop));
	starpu_data_unregister_submit(xg);
	starpu_data_unregister_submit(work);
	starpu_data_unregister_submit(out);
	return rc;
}

int rmoe_chunk_backward(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_routing *rt,
                        starpu_data_handle_t x, starpu_data_handle_t dy, starpu_data_handle_t w,
                        const struct rmoe_chunk *c, starpu_data_handle_t dx, starpu_data_handle_t dw, int accumulate,
                        int prio, int hop)
{
	const int64_t rows = c->rows;
	starpu_data_handle_t xg = rmoe_act_vector(pass, L, rows * L->H);
	starpu_data_handle_t dyg = rmoe_act_vector(pass, L, rows * L->H);
	starpu_data_handle_t work = rmoe_act_vector(pass, L, rows * 4 * L->F);
	int rc = rmoe_pass_gather(L, pass, rt, x, c->first, rows, 0, xg, prio, rmoe_task_name("gather", hop));
	if (!rc)
		rc = rmoe_pass_gather(L, pass, rt, dy, c->first, rows, 0, dyg, prio, rmoe_task_name("gather-dy", hop));
	if (!rc)
		rc = rmoe_pass_expert_ffn(L, NULL, xg, w, L->e_local, L->F, c->rows_per_expert, rows, work, NULL, prio,
		                          rmoe_task_name("recompute", hop));
	if (!rc)
		rc = rmoe_pass_expert_bwd_pairs(L, pass, rt, xg, dyg, w, c, work, dx, dw, accumulate, prio,
		                                rmoe_task_name("expert-bwd", hop));
	starpu_data_unregister_submit(xg);
	starpu_data_unregister_submit(dyg);
	starpu_data_unregister_submit(work);
	return rc;
}

/* ---- task names ------------------------------------------------------------------------------ */

/* StarPU keeps the name pointer until the task is gone, so names with a hop
 * number are interned for the life of the process (ops x hops: bounded). */
struct interned {
	struct interned *next;
	char s[];
};
static struct interned *interned_names;
static pthread_mutex_t interned_lock = PTHREAD_MUTEX_INITIALIZER;

const char *rmoe_task_name(const char *op, int hop)
{
	char buf[64];
	if (hop >= 0)
		snprintf(buf, sizeof(buf), "%s h%d", op, hop);
	else
		snprintf(buf, sizeof(buf), "%s", op);
	pthread_mutex_lock(&interned_lock);
	struct interned *i;
	for (i = interned_names; i; i = i->next)
		if (strcmp(i->s, buf) == 0)
			break;
	if (!i) {
		i = malloc(sizeof(*i) + strlen(buf) + 1);
		if (i) {
			strcpy(i->s, buf);
			i->next = interned_names;
			interned_names = i;
		}
	}
	pthread_mutex_unlock(&interned_lock);
	return i ? i->s : op;
}
