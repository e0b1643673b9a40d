/* Ring token routing (paper §3.2).
 *
 * Experts stay on their owner; each rank's token partition travels around
 * the ring instead. At hop h the rank at ring position i holds the tokens of
 * the rank at position i - h with their routing (pair order and weights) and
 * their output accumulator Y; it computes the pairs routed to its own experts,
 * adds them into Y, and passes everything to the right. After N hops each
 * partition has met every expert: the rank at position i then holds the
 * finished Y of position i+1, and one transfer returns it to its owner.
 *
 * Buffers are in the window's slots per kind, credited, as in expert
 * routing (flow.c). The inputs (x,
 * routing) leave for the right as soon as the hop starts, since they are only
 * read. The accumulators travel a hop behind them, like the gradients of
 * expert routing (§3.1): a hop computes into a local partial without waiting
 * for the visiting accumulator, adds the partial in place once it has
 * arrived, and sends it on; the next hop's expert task waits for that
 * addition (the gate of window.c), so one partial exists at a time.
 *
 * Backward carries x, dy and the routing with the accumulators dx and dg;
 * each hop reconstructs its intermediates (§3.3) and the weight gradient of
 * the resident experts accumulates locally. Every rank's expert counts are
 * exchanged first, so the host knows each visiting partition's slice sizes.
 *
 * Ranks may hold different token counts (rmoe_layer_set_tokens): every
 * partition then travels with the rows of the largest (L->T_max), a
 * smaller one padded (own_open), since a slot takes every partition in
 * turn and StarPU-MPI receives a message only into a buffer of its size.
 *
 * Where the ring's edges are striped (graph/pass/stripes.c), every kind
 * crosses between nodes in pieces, each rank relaying its own; the slots
 * and padded copies are then the pass's host memory (pieces need a home
 * node). */
#include <stdlib.h>
#include <string.h>

#include "rmoe_dispatch.h"

/* What travels with a token partition, one handle per kind. */
enum kind { X, DY, ORDER, WEIGHTS, ACC, DG, NKINDS };

struct token_ring {
	int32_t *counts;                  /* [N * E] every rank's expert counts */
	int64_t *offsets;                 /* [N * (E+1)] their prefix sums */
	int nslots;                       /* min(window, N): hop h in slot h mod window */
	starpu_data_handle_t *buf[NKINDS];  /* [nslots] per kind; NULL: a kind not relayed */
};

/* Elements per token of each kind, and their size: activations in the
 * layer's element type, routing 4-byte. */
static int64_t per_token(const struct rmoe_layer *L, int k)
{
	return k == ORDER || k == WEIGHTS || k == DG ? L->K : L->H;
}

static size_t elsize(const struct rmoe_layer *L, int k)
{
	return k == ORDER ? sizeof(int32_t) : k == WEIGHTS || k == DG ? sizeof(float) : L->act;
}

static int ring_init(struct rmoe_layer *L, struct rmoe_pass *pass, struct token_ring *R, int backward)
{
	const int N = L->N;
	const int64_t E = L->E;
	memset(R, 0, sizeof(*R));
	R->counts = calloc((size_t)(N * E), sizeof(int32_t));
	R->offsets = calloc((size_t)(N * (E + 1)), sizeof(int64_t));
	if (!R->counts || !R->offsets)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	int rc = rmoe_exchange_counts(L, pass, pass->tag_base, R->counts);
	if (rc)
		return rc;
	for (int q = 0; q < N; q++)
		rmoe_counts_offsets(R->counts + (int64_t)q * E, E, R->offsets + (int64_t)q * (E + 1));
	if (N == 1)
		return 0;
	R->nslots = L->window < N ? L->window : N;
	for (int k = 0; k < NKINDS; k++) {
		if (!backward && (k == DY || k == DG))
			continue;
		R->buf[k] = calloc((size_t)R->nslots, sizeof(starpu_data_handle_t));
		if (!R->buf[k])
			return rmoe_error(RMOE_ENOMEM, "out of host memory");
		for (int b = 0; b < R->nslots; b++) {
			R->buf[k][b] = rmoe_ring_buffer(pass, L, L->T_max * per_token(L, k), elsize(L, k));
			if (!R->buf[k][b])
				return rmoe_error(RMOE_ENOMEM, "out of host memory");
		}
	}
	return 0;
}

/* This rank's partition as the ring carries it (own), from its handles
 * (user; NULL: a kind the pass does not carry): they themselves, or, with
 * fewer tokens than the call's largest, copies of T_max rows, zero after
 * this rank's; the accumulators' copies start as the handles (y and dx
 * hold the shared expert's part), dg's at zero. */
static int own_open(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t *user, starpu_data_handle_t *own)
{
	int rc = 0;
	for (int k = 0; k < NKINDS; k++) {
		own[k] = user[k];
		if (!user[k] || L->T == L->T_max)
			continue;
		const int64_t n = L->T_max * per_token(L, k);
		own[k] = rmoe_ring_buffer(pass, L, n, elsize(L, k));
		if (!own[k]) {
			own[k] = user[k];
			return rmoe_error(RMOE_ENOMEM, "out of host memory");
		}
		struct rmoe_task_opts o = rmoe_opts(L, "pad-partition", rmoe_prio_hop(0, L->N));
		if (!rc)
			rc = k == DG || L->T == 0 ? rmoe_insert_zero(&o, n, own[k])
			                          : rmoe_insert_copy_pad(&o, L->T * per_token(L, k), user[k], n, own[k]);
	}
	return rc;
}

/* The padded accumulators' rows back into this rank's handles; the copies
 * freed once their tasks end. */
static int own_close(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t *user,
                     starpu_data_handle_t *own, int rc)
{
	for (int k = 0; k < NKINDS; k++) {
		if (own[k] == user[k])
			continue;
		struct rmoe_task_opts o = rmoe_opts(L, "unpad-partition", 0);
		if (!rc && (k == ACC || k == DG) && L->T > 0)
			rc = rmoe_insert_copy_pad(&o, L->T_max * per_token(L, k), own[k], L->T * per_token(L, k), user[k]);
		/* A striped pass's copies are its host memory: held to its end. */
		if (L->striped)
			rmoe_pass_hold(pass, own[k]);
		else
			starpu_data_unregister_submit(own[k]);
	}
	return rc;
}

static void ring_free(struct rmoe_pass *pass, struct token_ring *R)
{
	for (int k = 0; k < NKINDS; k++) {
		for (int b = 0; R->buf[k] && b < R->nslots && R->buf[k][b]; b++)
			rmoe_pass_hold(pass, R->buf[k][b]);
		free(R->buf[k]);
	}
	free(R->counts);
	free(R->offsets);
}

/* One pass of the ring. own[k] are this rank's handles (hop 0 and the final
 * return); inputs are kinds sent at the start of a hop, accs those sent at
 * its end. compute_hop submits the hop's tasks on the held handles. */
typedef int (*hop_fn)(struct rmoe_layer *L, struct rmoe_pass *pass, int h, starpu_data_handle_t *held,
                      const struct rmoe_routing *rt, int *dw_written);

/* The receives of hop rh (inputs and accumulators) into their slots, after
 * its credit to the left when the slots are reused (flow.c). */
static int recv_hop(struct rmoe_layer *L, struct rmoe_pass *pass, struct token_ring *R, int rh, const int *inputs,
                    int ninputs, const int *accs, int naccs, int64_t tag)
{
	const int slot = rh % L->window;
	int rc = 0;
	if (rmoe_flow_needed(L, rh, 1)) {
		starpu_data_handle_t s[NKINDS];
		for (int i = 0; i < ninputs; i++)
			s[i] = R->buf[inputs[i]][slot];
		for (int i = 0; i < naccs; i++)
			s[ninputs + i] = R->buf[accs[i]][slot];
		/* The credit's fence writes the slots: their last sends'
		 * partitions end first (stripes.c). */
		for (int i = 0; i < ninputs + naccs; i++)
			rmoe_ring_settle(pass, s[i]);
		rc = rmoe_flow_grant(L, pass, rmoe_flow_tag(L, pass, 0, rh), s, ninputs + naccs);
	}
	for (int i = 0; i < ninputs && !rc; i++)
		rc = rmoe_ring_recv(L, pass, R->buf[inputs[i]][slot], tag + inputs[i]);
	for (int i = 0; i < naccs && !rc; i++)
		rc = rmoe_ring_recv(L, pass, R->buf[accs[i]][slot], tag + accs[i]);
	return rc;
}

/* Sends held[kinds[i]] right as the right neighbour's hop rh, after the
 * credit of that hop (*credit, received at the first send that needs it). */
static int send_kinds(struct rmoe_layer *L, struct rmoe_pass *pass, int rh, starpu_data_handle_t *held,
                      const int *kinds, int n, int64_t tag, int prio, starpu_data_handle_t *credit)
{
	int rc = 0;
	if (rmoe_flow_needed(L, rh, 1) && !*credit)
		rc = rmoe_flow_await(L, pass, rmoe_flow_tag(L, pass, 0, rh), credit);
	for (int i = 0; i < n && !rc; i++) {
		if (*credit) {
			rmoe_ring_settle(pass, held[kinds[i]]);
			rc = rmoe_flow_gate(L, pass, *credit, held[kinds[i]]);
		}
		if (!rc)
			rc = rmoe_ring_send(L, pass, held[kinds[i]], rh, tag + kinds[i], prio);
		if (!rc)
			rc = rmoe_ring_relay(L, pass, kinds[i], rh, L->T_max * per_token(L, kinds[i]), elsize(L, kinds[i]),
			                     tag + kinds[i], prio);
	}
	return rc;
}

static int run_ring(struct rmoe_layer *L, struct rmoe_pass *pass, struct token_ring *R,
                    starpu_data_handle_t own[NKINDS], const int *inputs, int ninputs, const int *accs,
                    int naccs, hop_fn compute_hop, int *dw_written)
{
	const int N = L->N, overlap = L->cfg.overlap;
	/* tags: the counts exchange, then NKINDS per hop, then the returns */
	const int64_t tag0 = pass->tag_base + 1;
	int rc = 0;
	for (int h = 0; h < N && !rc; h++) {
		int src = L->ring[(L->ring_pos - h + N) % N];    /* whose tokens we hold */
		int prio = rmoe_prio_hop(h, N);
		int last = h == N - 1;
		starpu_data_handle_t held[NKINDS], credit = NULL;
		for (int k = 0; k < NKINDS; k++)
			held[k] = h == 0 || !R->buf[k] ? own[k] : R->buf[k][h % L->window];
		struct rmoe_routing rt = {held[ORDER], held[WEIGHTS], held[DG],
		                          R->offsets + (int64_t)src * (L->E + 1)};
		int64_t tag = tag0 + (int64_t)h * NKINDS;
		if (!last && overlap) {
			rc = send_kinds(L, pass, h + 1, held, inputs, ninputs, tag, prio + 1, &credit);
			if (!rc)
				rc = recv_hop(L, pass, R, h + 1, inputs, ninputs, accs, naccs, tag);
		}
		if (!rc)
			rc = compute_hop(L, pass, h, held, &rt, dw_written);
		if (rc || N == 1)
			break;
		if (!overlap)
			starpu_task_wait_for_all();
		if (!last)
			rc = send_kinds(L, pass, h + 1, held, accs, naccs, tag, prio + 1, &credit);
		for (int i = 0; i < naccs && !rc && last; i++) {
			/* The finished accumulators of position i+1 go home. */
			int k = accs[i];
			int64_t ret_tag = tag0 + (int64_t)N * NKINDS + k;
			rc = rmoe_ring_send(L, pass, held[k], 0, ret_tag, prio + 1);
			if (!rc)
				rc = rmoe_ring_relay(L, pass, NKINDS + k, 0, L->T_max * per_token(L, k), elsize(L, k), ret_tag,
				                     prio + 1);
			if (!rc)
				rc = rmoe_ring_recv(L, pass, own[k], ret_tag);
		}
		if (!last && !overlap) {
			rc = rc ? rc : send_kinds(L, pass, h + 1, held, inputs, ninputs, tag, prio + 1, &credit);
			if (!rc)
				rc = recv_hop(L, pass, R, h + 1, inputs, ninputs, accs, naccs, tag);
			const int slot = (h + 1) % L->window;
			for (int i = 0; i < ninputs && !rc; i++)
				rc = rmoe_wait_data(pass->wait, R->buf[inputs[i]][slot]);
			for (int i = 0; i < naccs && !rc; i++)
				rc = rmoe_wait_data(pass->wait, R->buf[accs[i]][slot]);
		}
	}
	return rc;
}

/* Forward of one hop: the visiting tokens' pairs routed to the resident
 * experts, added into the visiting accumulator. */
static int forward_hop(struct rmoe_layer *L, struct rmoe_pass *pass, int h, starpu_data_handle_t *held,
                       const struct rmoe_routing *rt, int *dw_written)
{
	(void)dw_written;
	struct rmoe_chunk *chunks;
	int64_t n = rmoe_partition_chunks(L, rt->offsets, L->ctx->rank, L->cfg.chunk_rows, &chunks);
	if (n < 0)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	int prio = rmoe_prio_hop(h, L->N), rc = 0;
	/* Hop 0 adds into this rank's own y; later hops into a partial. */
	starpu_data_handle_t acc = held[ACC];
	const int64_t TH = L->T_max * L->H;
	if (h > 0 && n > 0) {
		acc = rmoe_act_vector(pass, L, TH);
		rc = rmoe_pass_zero(L, pass, acc, TH, prio, rmoe_task_name("zero-partial", h));
	}
	for (int64_t c = 0; c < n && !rc; c++)
		rc = rmoe_chunk_forward(L, pass, rt, held[X], L->h_w_part, &chunks[c], acc, prio, h);
	if (acc != held[ACC]) {
		if (!rc)
			rc = rmoe_pass_accumulate(L, pass, acc, held[ACC], TH, prio, rmoe_task_name("accumulate", h));
		starpu_data_unregister_submit(acc);
	}
	rmoe_chunks_free(chunks, n);
	return rc;
}

int rmoe_ring_token_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y)
{
	/* No rank has a token: nothing travels. */
	if (L->T_max == 0)
		return 0;
	struct token_ring R;
	int rc = ring_init(L, pass, &R, 0);
	starpu_data_handle_t user[NKINDS] = {L->h_x, NULL, L->h_pair_order, L->h_topk_w, y, NULL}, own[NKINDS];
	static const int inputs[] = {X, ORDER, WEIGHTS}, accs[] = {ACC};
	int orc = own_open(L, pass, user, own);
	if (!rc)
		rc = orc;
	if (!rc)
		rc = run_ring(L, pass, &R, own, inputs, 3, accs, 1, forward_hop, NULL);
	rc = own_close(L, pass, user, own, rc);
	ring_free(pass, &R);
	return rc;
}

/* Backward of one hop (§3.3: reconstruct, consume, release): dx and dg of
 * the visiting tokens accumulate into the travelling buffers; the resident
 * experts' weight gradient into the owner's, across hops. */
static int backward_hop(struct rmoe_layer *L, struct rmoe_pass *pass, int h, starpu_data_handle_t *held,
                        const struct rmoe_routing *rt, int *dw_written)
{
	struct rmoe_chunk *chunks;
	int64_t n = rmoe_partition_chunks(L, rt->offsets, L->ctx->rank, L->cfg.chunk_rows, &chunks);
	if (n < 0)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	int prio = rmoe_prio_hop(h, L->N), rc = 0;
	/* Hop 0 adds into this rank's own dx and dg; later hops into partials. */
	struct rmoe_routing part = *rt;
	starpu_data_handle_t dx = held[ACC];
	const int64_t TH = L->T_max * L->H, TK = L->T_max * L->K;
	if (h > 0 && n > 0) {
		dx = rmoe_act_vector(pass, L, TH);
		part.dg = rmoe_temp_vector(pass, TK, sizeof(float));
		rc = rmoe_pass_zero(L, pass, dx, TH, prio, rmoe_task_name("zero-partial", h));
		if (!rc)
			rc = rmoe_pass_zero(L, pass, part.dg, TK, prio, rmoe_task_name("zero-partial", h));
		rt = &part;
	}
	for (int64_t c = 0; c < n && !rc; c++) {
		rc = rmoe_chunk_backward(L, pass, rt, held[X], held[DY], L->h_w_part, &chunks[c], dx, L->h_dw_part,
		                         *dw_written, prio, h);
		*dw_written = 1;
	}
	if (dx != held[ACC]) {
		/* dg first: the gate goes to the larger dx addition. */
		if (!rc)
			rc = rmoe_pass_accumulate(L, NULL, part.dg, held[DG], TK, prio, rmoe_task_name("accumulate-dg", h));
		if (!rc)
			rc = rmoe_pass_accumulate(L, pass, dx, held[ACC], TH, prio, rmoe_task_name("accumulate", h));
		starpu_data_unregister_submit(dx);
		starpu_data_unregister_submit(part.dg);
	}
	rmoe_chunks_free(chunks, n);
	return rc;
}

int rmoe_ring_token_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                             starpu_data_handle_t dx)
{
	if (L->T_max == 0)
		return rmoe_pass_zero(L, NULL, L->h_dw_part, L->part_floats, 0, "zero-grad");
	struct token_ring R;
	int rc = ring_init(L, pass, &R, 1);
	starpu_data_handle_t user[NKINDS] = {L->h_x, dy, L->h_pair_order, L->h_topk_w, dx, L->h_dg}, own[NKINDS];
	static const int inputs[] = {X, DY, ORDER, WEIGHTS}, accs[] = {ACC, DG};
	int dw_written = 0;
	/* Partials add into dg (dx starts zeroed by the layer): clear it (a
	 * padded copy starts at zero). */
	if (!rc && L->T == L->T_max)
		rc = rmoe_pass_zero(L, NULL, L->h_dg, L->T * L->K, rmoe_prio_hop(0, L->N), "zero-dg");
	int orc = own_open(L, pass, user, own);
	if (!rc)
		rc = orc;
	if (!rc)
		rc = run_ring(L, pass, &R, own, inputs, 4, accs, 2, backward_hop, &dw_written);
	rc = own_close(L, pass, user, own, rc);
	/* No visiting pair ever reached the resident experts. */
	if (!rc && !dw_written)
		rc = rmoe_pass_zero(L, NULL, L->h_dw_part, L->part_floats, 0, "zero-grad");
	ring_free(pass, &R);
	return rc;
}
