/* The all-to-alls' plan: every rank's expert counts exchanged once per
 * layer call, in the forward (Megatron's dispatcher synchronises on its
 * "tokens per expert" the same way), and who sends what to whom from them,
 * in chunks; kept for the backward, whose routing is the forward's. With
 * it, the transfers and small tasks the chunked graphs share. */
#include <stdlib.h>
#include <string.h>

#include <starpu_mpi.h>

#include "rmoe_alltoall.h"

void rmoe_a2a_plan_free(struct rmoe_a2a_plan *p)
{
	if (!p)
		return;
	for (int q = 0; q < p->N && p->nsend; q++) {
		if (p->send)
			rmoe_chunks_free(p->send[q], p->nsend[q]);
		if (p->recv)
			rmoe_chunks_free(p->recv[q], p->nrecv[q]);
	}
	/* The allocations the plan's arrays are carved from (plan_chunks, plan_fill). */
	void *owned[] = {p->send, p->recv, p->nsend, p->send_first, p->peer_counts, p->peer_offsets, p->unsort_map, p};
	for (size_t i = 0; i < sizeof(owned) / sizeof(owned[0]); i++)
		free(owned[i]);
}

/* The chunks of the blocks, both ways (struct rmoe_a2a_plan). */
static int plan_chunks(const struct rmoe_layer *L, struct rmoe_a2a_plan *p)
{
	const int N = p->N;
	const int64_t E = L->E, c = L->cfg.chunk_rows;
	p->send = calloc((size_t)N, sizeof(*p->send));
	p->recv = calloc((size_t)N, sizeof(*p->recv));
	p->nsend = calloc((size_t)(2 * N), sizeof(int64_t));
	if (!p->send || !p->recv || !p->nsend)
		return rmoe_error(RMOE_ENOMEM, "out of host memory for the all-to-all plan");
	p->nrecv = p->nsend + N;
	for (int q = 0; q < N; q++) {
		p->nsend[q] = rmoe_partition_chunks(L, L->expert_offsets, q, c, &p->send[q]);
		p->nrecv[q] = rmoe_partition_chunks(L, p->peer_offsets + (int64_t)q * (E + 1), p->me, c, &p->recv[q]);
		if (p->nsend[q] < 0 || p->nrecv[q] < 0) {
			p->nsend[q] = p->nsend[q] < 0 ? 0 : p->nsend[q];
			p->nrecv[q] = p->nrecv[q] < 0 ? 0 : p->nrecv[q];
			return rmoe_error(RMOE_ENOMEM, "out of host memory for the all-to-all's chunks");
		}
		for (int64_t j = 0; j < p->nrecv[q]; j++)
			if (p->recv[q][j].rows > p->max_recv_rows)
				p->max_recv_rows = p->recv[q][j].rows;
	}
	return 0;
}

static int plan_fill(struct rmoe_layer *L, struct rmoe_pass *pass, struct rmoe_a2a_plan *p)
{
	const int N = L->N, me = L->ctx->rank;
	const int64_t el = L->e_local, E = L->E;
	p->N = N;
	p->me = me;
	const int64_t W = rmoe_counts_width(L);
	p->send_first = calloc((size_t)(5 * N + N * el + el), sizeof(int64_t));
	p->peer_counts = calloc((size_t)(N * W), sizeof(int32_t));
	p->peer_offsets = calloc((size_t)(N * (E + 1)), sizeof(int64_t));
	if (!p->send_first || !p->peer_counts || !p->peer_offsets)
		return rmoe_error(RMOE_ENOMEM, "out of host memory for the all-to-all plan");
	p->send_rows = p->send_first + N;
	p->recv_rows = p->send_rows + N;
	p->chunk_rows = p->recv_rows + N;
	p->rows_per_expert = p->chunk_rows + N * el;
	p->send_tokens = p->rows_per_expert + el;
	p->recv_tokens = p->send_tokens + N;

	int rc = rmoe_exchange_counts(L, pass, pass->tag_base, p->peer_counts);
	if (rc)
		return rc;
	for (int q = 0; q < N; q++) {
		rmoe_counts_offsets(p->peer_counts + (int64_t)q * W, E, p->peer_offsets + (int64_t)q * (E + 1));
		p->send_first[q] = rmoe_pairs_first(L->expert_offsets, q * el);
		p->send_rows[q] = rmoe_pairs_count(L->expert_offsets, q * el, el);
		if (W > E) {
			p->send_tokens[q] = p->peer_counts[(int64_t)me * W + E + q];
			p->recv_tokens[q] = p->peer_counts[(int64_t)q * W + E + me];
		}
		for (int64_t e = 0; e < el; e++) {
			int64_t c = p->peer_counts[(int64_t)q * W + me * el + e];
			p->chunk_rows[q * el + e] = c;
			p->recv_rows[q] += c;
			p->rows_per_expert[e] += c;
			p->M += c;
		}
	}
	p->unsort_map = malloc((size_t)(p->M > 0 ? p->M : 1) * sizeof(int32_t));
	if (!p->unsort_map)
		return rmoe_error(RMOE_ENOMEM, "out of host memory for the all-to-all plan");
	int64_t j = 0;
	for (int q = 0; q < N; q++)
		for (int64_t e = 0, at = 0; e < el; at += p->rows_per_expert[e], e++) {
			int64_t before = 0;
			for (int r = 0; r < q; r++)
				before += p->chunk_rows[r * el + e];
			for (int64_t i = 0; i < p->chunk_rows[q * el + e]; i++)
				p->unsort_map[j++] = (int32_t)(at + before + i);
		}
	return plan_chunks(L, p);
}

int rmoe_a2a_plan_build(struct rmoe_layer *L, struct rmoe_pass *pass)
{
	rmoe_a2a_plan_free(L->a2a);
	L->a2a = calloc(1, sizeof(*L->a2a));
	if (!L->a2a)
		return rmoe_error(RMOE_ENOMEM, "out of host memory for the all-to-all plan");
	int rc = plan_fill(L, pass, L->a2a);
	if (rc) {
		rmoe_a2a_plan_free(L->a2a);
		L->a2a = NULL;
	}
	return rc;
}

int rmoe_a2a_plan_get(struct rmoe_layer *L, const struct rmoe_a2a_plan **p)
{
	*p = L->a2a;
	return L->a2a ? 0 : rmoe_error(RMOE_ESTATE, "the all-to-all's backward has no plan: its forward did not complete");
}

/* Chunks of one block: at most the pairs of a rank, in chunks of the
 * layer's chunk rows (a block is one chunk without). The call's largest
 * count, not this rank's: every rank numbers its tags alike. */
static int64_t max_chunks(const struct rmoe_layer *L)
{
	const int64_t P = L->T_max * L->K, c = L->cfg.chunk_rows;
	return c > 0 && c < P ? (P + c - 1) / c : 1;
}

int64_t rmoe_a2a_tags(const struct rmoe_layer *L)
{
	return 1 + RMOE_A2A_KINDS * max_chunks(L);
}

int64_t rmoe_a2a_tag(const struct rmoe_layer *L, const struct rmoe_pass *pass, int kind, int64_t j)
{
	return pass->tag_base + 1 + kind * max_chunks(L) + j;
}

int rmoe_a2a_post_recvs(struct rmoe_layer *L, struct rmoe_pass *pass, const starpu_data_handle_t *h, int n, int peer,
                        int kind0, int64_t j, int grant, struct starpu_task *after, struct starpu_task **posted,
                        const char *const *what)
{
	/* StarPU-MPI posts a receive, and allocates its buffer, once the
	 * handle's earlier accesses have ended: this fence's (the grant's). */
	int rc = grant && L->flow_credits ? rmoe_flow_grant_to(L, pass, peer, rmoe_a2a_tag(L, pass, RMOE_A2A_KIND_CREDIT, j), h, n, after)
	               : rmoe_pass_fence(L, pass, NULL, 0, h, n, after, posted, "a2a-post");
	for (int k = 0; k < n && !rc; k++) {
		const int64_t tag = rmoe_a2a_tag(L, pass, kind0 + k, j);
		rc = rmoe_recv(L, h[k], peer, tag);
		if (!rc)
			rc = rmoe_pass_watch(L, pass, h[k], peer, tag, 1, what[k]);
	}
	return rc;
}

int rmoe_a2a_sends(struct rmoe_layer *L, struct rmoe_pass *pass, const starpu_data_handle_t *h, int n, int peer,
                   int kind0, int64_t j, int credited, struct starpu_task *after, int prio, const char *const *what)
{
	starpu_data_handle_t credit;
	int rc = 0;
	if (credited && L->flow_credits) {
		rc = rmoe_flow_await_from(L, pass, peer, rmoe_a2a_tag(L, pass, RMOE_A2A_KIND_CREDIT, j), &credit);
		if (!rc)
			rc = rmoe_pass_fence(L, pass, &credit, 1, h, n, after, NULL, "credit-wait");
	}
	for (int k = 0; k < n && !rc; k++) {
		const int64_t tag = rmoe_a2a_tag(L, pass, kind0 + k, j);
		rc = rmoe_send(L, pass, h[k], peer, tag, prio, NULL, NULL);
		if (!rc)
			rc = rmoe_pass_watch(L, pass, h[k], peer, tag, 0, what[k]);
	}
	return rc;
}

int rmoe_a2a_reserve_credits(const struct rmoe_a2a_plan *p, struct rmoe_pass *pass)
{
	int64_t n = 0;
	for (int q = 0; q < p->N; q++)
		if (q != p->me)
			n += p->nsend[q] + p->nrecv[q];
	return rmoe_flow_reserve(pass, n);
}

void rmoe_a2a_release_sent(starpu_data_handle_t *h, int n)
{
	for (int i = 0; i < n; i++)
		if (h[i]) {
			/* A sent buffer's last access is StarPU-MPI's, which releases
			 * the data while it still holds the handle busy: unregistered
			 * alone it would be freed only after the fence's successors
			 * have started. The invalidation frees it when the fence ends. */
			starpu_data_invalidate_submit(h[i]);
			starpu_data_unregister_submit(h[i]);
			h[i] = NULL;
		}
}

int rmoe_a2a_done(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t *h, int n,
                  struct starpu_task **done)
{
	int rc = rmoe_pass_fence(L, pass, NULL, 0, h, n, NULL, done, "a2a-done");
	rmoe_a2a_release_sent(h, n);
	return rc;
}

int rmoe_a2a_gather(struct rmoe_layer *L, starpu_data_handle_t src, int64_t width, int64_t topk, int64_t first,
                    int64_t rows, starpu_data_handle_t out, struct starpu_task *after, int prio, const char *name)
{
	struct rmoe_task_opts o = rmoe_opts(L, name, prio);
	o.after = after;
	struct rmoe_pair_slice s = {first, rows, width, topk};
	return rmoe_insert_gather(&o, &s, src, L->h_pair_order, NULL, out);
}

int rmoe_a2a_identity_grow(struct rmoe_layer *L, int64_t n)
{
	if (n <= L->iota_n)
		return 0;
	int32_t *v = realloc(L->iota, (size_t)n * sizeof(int32_t));
	if (!v)
		return rmoe_error(RMOE_ENOMEM, "out of host memory for %lld rows' pair order", (long long)n);
	for (int64_t i = L->iota_n; i < n; i++)
		v[i] = (int32_t)i;
	L->iota = v;
	L->iota_n = n;
	return 0;
}

starpu_data_handle_t rmoe_a2a_identity(struct rmoe_layer *L, int64_t n)
{
	return rmoe_host_vector(NULL, L->iota, n, sizeof(int32_t));
}

/* A backward's start: dg zeroed, the identity pair order of identity_rows
 * rows grown and counted, the weight gradient zeroed when this rank's
 * experts compute no row. */
static int backward_begin(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_a2a_plan *p,
                          int64_t identity_rows)
{
	/* dg arrives as additions at the pairs (scatter-add): from zero. */
	int rc = rmoe_pass_zero(L, NULL, L->h_dg, L->T * L->K, 0, "zero-dg");
	/* The identity pair order of the largest chunk, host memory the
	 * chunks' expert tasks read: counted in the pass. */
	pass->resident += 4 * identity_rows;
	if (!rc)
		rc = rmoe_a2a_identity_grow(L, identity_rows);
	if (!rc && p->max_recv_rows == 0)
		rc = rmoe_pass_zero(L, NULL, L->h_dw_part, L->part_floats, 0, "zero-grad");
	return rc;
}

/* The steps in the exchange order (scheduler/exchange_order.c: on several
 * nodes a node's own steps first, then the other nodes', one adapter per
 * block each way). A sender's tasks (its blocks' gathers, the results'
 * additions) rank above every step's expert tasks: a block gathered late
 * leaves late, and on one GPU a gather queued behind the experts of the
 * blocks already here held every later send back by their compute
 * (a2a-deepep at full size, EP 8: 150.4 ms simulated, 123.1 with this
 * order and these priorities; docs/ring.md). */
static int exchange(struct rmoe_a2a_run *r, const struct rmoe_a2a_steps *s)
{
	const struct rmoe_a2a_plan *p = r->p;
	const int N = p->N, me = p->me;
	int *order = malloc(sizeof(int) * (size_t)(2 * N));
	if (!order)
		return rmoe_error(RMOE_ENOMEM, "out of host memory for the exchange order");
	int rc = rmoe_exchange_order(&r->L->ctx->topo, me, order, order + N);
	for (int i = 0; i < N && !rc; i++) {
		const int to = order[i], from = order[N + i], prio = rmoe_prio_hop(i, N);
		if (i == 0) {
			for (int64_t j = 0; j < p->nsend[me] && !rc; j++)
				rc = s->own(r, me, j, &p->send[me][j], prio);
			continue;
		}
		for (int64_t j = 0; j < p->nsend[to] && !rc; j++)
			rc = s->token(r, to, j, &p->send[to][j], prio + rmoe_prio_hop(0, N));
		for (int64_t j = 0; j < p->nrecv[from] && !rc; j++)
			rc = s->expert(r, from, j, &p->recv[from][j], prio);
	}
	free(order);
	return rc;
}

/* The steps with the depths of both roles (rmoe_a2a_depth: the window, or
 * by default every peer's blocks, two under a memory cap). */
static int run_steps(struct rmoe_a2a_run *r, const struct rmoe_a2a_steps *s)
{
	const struct rmoe_layer *L = r->L;
	const int64_t depth = rmoe_a2a_depth(L->cfg.window, L->N, L->cfg.mem_cap > 0);
	r->tokens = (struct rmoe_a2a_depth){.done = calloc((size_t)depth, sizeof(struct starpu_task *)), .depth = depth};
	r->experts = (struct rmoe_a2a_depth){.done = calloc((size_t)depth, sizeof(struct starpu_task *)), .depth = depth};
	int rc = r->tokens.done && r->experts.done ? exchange(r, s)
	                                           : rmoe_error(RMOE_ENOMEM, "out of host memory for the pipeline");
	/* The arrays hold the kept fences' pointers while submitting only. */
	free(r->tokens.done);
	free(r->experts.done);
	r->tokens.done = r->experts.done = NULL;
	return rc;
}

int rmoe_a2a_forward_run(struct rmoe_a2a_run *r, const struct rmoe_a2a_steps *s)
{
	int rc = rmoe_a2a_plan_build(r->L, r->pass);
	if (!rc)
		rc = rmoe_a2a_reserve_credits(r->L->a2a, r->pass);
	r->p = r->L->a2a;
	return rc ? rc : run_steps(r, s);
}

int rmoe_a2a_backward_run(struct rmoe_a2a_run *r, const struct rmoe_a2a_steps *s, int own_identity)
{
	int rc = rmoe_a2a_plan_get(r->L, &r->p);
	if (!rc)
		rc = rmoe_a2a_reserve_credits(r->p, r->pass);
	if (rc)
		return rc;
	const struct rmoe_a2a_plan *p = r->p;
	const int64_t own_rows = p->nsend[p->me] > 0 ? p->send[p->me][0].rows : 0;
	rc = backward_begin(r->L, r->pass, p, own_identity ? own_rows : p->max_recv_rows);
	return rc ? rc : run_steps(r, s);
}
