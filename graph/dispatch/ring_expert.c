/* Ring expert routing (paper §3.1, §3.3).
 *
 * N ranks on a ring (order from the plan); rank r owns partition P_r (its
 * experts). At hop h the rank at ring position i holds the partition of the
 * rank at position i - h, arrived from its left neighbour, and computes the
 * pairs of its own tokens routed to that partition. Weights arrive in the
 * window's slots (double buffering by default): while hop h computes on one
 * buffer, that buffer is sent right and the next partition is received into
 * another; StarPU orders the receive into a slot after the readers of the
 * hop it held (write after read), and the left neighbour sends only once
 * that has happened (the credits of flow.c). No buffer of T*K rows exists: the
 * largest temporaries are one hop's (or one chunk's) matched rows.
 *
 * Backward: the weights circulate again; each hop reconstructs the visiting
 * partition's intermediates from the saved x and the weights, consumes them and
 * releases them (§3.3). The partial weight gradient S of a hop is computed
 * without waiting for the gradient accumulator G of the same partition, which
 * arrives from the left one hop behind its weights; G += S, and G moves on.
 * After the last hop each rank holds the finished G of its right neighbour's
 * partition: one gradient-only transfer returns it to its owner. */
#include <stdlib.h>

#include "rmoe_dispatch.h"

/* Partition held at hop h by this rank. */
static int visiting(const struct rmoe_layer *L, int h)
{
	return L->ring[(L->ring_pos - h + L->N) % L->N];
}

/* Without overlap (the naive ring of the paper's ablation) a hop's transfers
 * start only after its compute has ended, and the next hop starts only once
 * they are done (rmoe_wait_data). */

/* Forward of one hop: gather the matched rows, grouped SwiGLU over the
 * visiting partition, weighted in-place accumulation into y. */
static int forward_hop(struct rmoe_layer *L, struct rmoe_pass *pass, int h,
                       starpu_data_handle_t weights, starpu_data_handle_t y)
{
	struct rmoe_chunk *chunks;
	int64_t n = rmoe_partition_chunks(L, L->expert_offsets, visiting(L, h), L->cfg.chunk_rows, &chunks);
	if (n < 0)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	int prio = rmoe_prio_hop(h, L->N), rc = 0;
	for (int64_t c = 0; c < n && !rc; c++)
		rc = rmoe_chunk_forward(L, pass, &L->own, L->h_x, weights, &chunks[c], y, prio, h);
	rmoe_chunks_free(chunks, n);
	return rc;
}

/* The ring's slots of one relayed kind: hop h in slot h mod window
 * (flow.c), at most N of them ever used; in the pass's host memory where
 * the ring is striped (its pieces need a home node, stripes.c). NULL when
 * out of memory. */
static starpu_data_handle_t *slots_alloc(struct rmoe_layer *L, struct rmoe_pass *pass, int *n)
{
	*n = L->window < L->N ? L->window : L->N;
	starpu_data_handle_t *s = calloc((size_t)*n, sizeof(*s));
	for (int i = 0; s && i < *n; i++) {
		s[i] = rmoe_ring_buffer(pass, L, L->part_floats, L->act);
		if (!s[i]) {
			/* Those made: held, so unregistered before their memory goes. */
			for (int j = 0; j < i; j++)
				rmoe_pass_hold(pass, s[j]);
			free(s);
			return NULL;
		}
	}
	return s;
}

/* Held to the pass's end (rmoe_pass_hold), then the array freed. */
static void slots_hold(struct rmoe_pass *pass, starpu_data_handle_t *s, int n)
{
	for (int i = 0; s && i < n; i++)
		rmoe_pass_hold(pass, s[i]);
	free(s);
}

/* Sends h, which the right neighbour receives as its hop rh into a slot of
 * credit kind kind first used at hop first: after its credit when the slot
 * is reused (flow.c). Where the ring's edges are striped, every rank
 * relays its pieces of the same transfer here too (stripes.c). */
static int send_hop(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t h, int kind, int rh,
                    int first, int64_t tag, int prio)
{
	int rc = 0;
	if (rmoe_flow_needed(L, rh, first)) {
		starpu_data_handle_t credit;
		/* The gate writes h: a striped send's partition of it ends first. */
		rmoe_ring_settle(pass, h);
		rc = rmoe_flow_await(L, pass, rmoe_flow_tag(L, pass, kind, rh), &credit);
		if (!rc)
			rc = rmoe_flow_gate(L, pass, credit, h);
	}
	if (!rc)
		rc = rmoe_ring_send(L, pass, h, rh, tag, prio);
	return rc ? rc : rmoe_ring_relay(L, pass, kind, rh, L->part_floats, L->act, tag, prio);
}

/* Receives this rank's hop h into slot: granted first when the slot is
 * reused (flow.c). */
static int recv_hop(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t slot, int kind, int h,
                    int first, int64_t tag)
{
	int rc = 0;
	if (rmoe_flow_needed(L, h, first)) {
		/* The credit's fence writes the slot: its last send's partition
		 * ends first (stripes.c; rmoe_ring_recv does it otherwise). */
		rmoe_ring_settle(pass, slot);
		rc = rmoe_flow_grant(L, pass, rmoe_flow_tag(L, pass, kind, h), &slot, 1);
	}
	return rc ? rc : rmoe_ring_recv(L, pass, slot, tag);
}

/* Credit kinds and the hop at which their slots are first used: weights
 * from hop 1 (hop 0 holds the owner's), gradients from hop 0; the
 * gradients' return has no credit, but its relayed pieces a kind. */
enum { CREDIT_WEIGHTS, CREDIT_GRADIENTS, RELAY_RETURN };
enum { FIRST_WEIGHTS = 1, FIRST_GRADIENTS = 0 };

/* The weights' relay of hop h: hold leaves for the right, the next
 * partition arrives into next. */
static int relay_weights(struct rmoe_layer *L, struct rmoe_pass *pass, int h, starpu_data_handle_t hold,
                         starpu_data_handle_t next, int64_t tag)
{
	int rc = send_hop(L, pass, hold, CREDIT_WEIGHTS, h + 1, FIRST_WEIGHTS, tag, rmoe_prio_hop(h, L->N) + 1);
	return rc ? rc : recv_hop(L, pass, next, CREDIT_WEIGHTS, h + 1, FIRST_WEIGHTS, tag);
}

int rmoe_ring_expert_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y)
{
	const int N = L->N, overlap = L->cfg.overlap;
	int W = 0;
	starpu_data_handle_t *rb = N > 1 ? slots_alloc(L, pass, &W) : NULL;
	if (N > 1 && !rb)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	int rc = 0;
	for (int h = 0; h < N && !rc; h++) {
		starpu_data_handle_t hold = h == 0 ? L->h_w_part : rb[h % L->window];
		starpu_data_handle_t next = h < N - 1 ? rb[(h + 1) % L->window] : NULL;
		int64_t tag = pass->tag_base + h;
		if (next && overlap)
			rc = relay_weights(L, pass, h, hold, next, tag);
		if (!rc)
			rc = forward_hop(L, pass, h, hold, y);
		if (!rc && next && !overlap) {
			starpu_task_wait_for_all();
			rc = relay_weights(L, pass, h, hold, next, tag);
			if (!rc)
				rc = rmoe_wait_data(pass->wait, next);
		}
	}
	slots_hold(pass, rb, W);
	return rc;
}

/* Backward of one hop's pairs into the partial weight gradient S (§3.3:
 * reconstruct, consume and release within the hop). Returns the number of
 * chunks (0: no local pair was routed to this partition). */
static int64_t backward_hop(struct rmoe_layer *L, struct rmoe_pass *pass, int h,
                            starpu_data_handle_t weights, starpu_data_handle_t dy,
                            starpu_data_handle_t dx, starpu_data_handle_t partial, int *rc)
{
	struct rmoe_chunk *chunks;
	int64_t n = rmoe_partition_chunks(L, L->expert_offsets, visiting(L, h), L->cfg.chunk_rows, &chunks);
	if (n < 0) {
		*rc = rmoe_error(RMOE_ENOMEM, "out of host memory");
		return 0;
	}
	int prio = rmoe_prio_hop(h, L->N);
	for (int64_t c = 0; c < n && !*rc; c++)
		*rc = rmoe_chunk_backward(L, pass, &L->own, L->h_x, dy, weights, &chunks[c], dx, partial, c > 0, prio, h);
	rmoe_chunks_free(chunks, n);
	return n;
}

int rmoe_ring_expert_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                              starpu_data_handle_t dx)
{
	const int N = L->N, overlap = L->cfg.overlap, W = L->window;
	const int64_t tag_w = pass->tag_base, tag_g = pass->tag_base + N, tag_final = pass->tag_base + 2 * N;
	int nrb = 0, ngb = 0;
	starpu_data_handle_t *rb = NULL, *gb = NULL;
	if (N > 1) {
		rb = slots_alloc(L, pass, &nrb);
		gb = slots_alloc(L, pass, &ngb);
		if (!rb || !gb) {
			slots_hold(pass, rb, nrb);
			slots_hold(pass, gb, ngb);
			return rmoe_error(RMOE_ENOMEM, "out of host memory");
		}
	}
	int rc = 0;
	for (int h = 0; h < N && !rc; h++) {
		int prio = rmoe_prio_hop(h, N);
		starpu_data_handle_t hold = h == 0 ? L->h_w_part : rb[h % W];
		starpu_data_handle_t next = h < N - 1 ? rb[(h + 1) % W] : NULL;
		/* G of the visiting partition; with one rank, the owner's gradient. */
		starpu_data_handle_t acc = N == 1 ? L->h_dw_part : gb[h % W];
		if (next && overlap)
			rc = relay_weights(L, pass, h, hold, next, tag_w + h);
		/* Posted before the hop's compute: it arrives while we compute. */
		if (!rc && h >= 1 && overlap)
			rc = recv_hop(L, pass, acc, CREDIT_GRADIENTS, h, FIRST_GRADIENTS, tag_g + h);
		if (rc)
			break;

		/* At hop 0 the partial is the accumulator itself; later hops keep
		 * it apart so it does not wait for the incoming G (§3.1). */
		starpu_data_handle_t partial = h == 0 ? acc : rmoe_act_vector(pass, L, L->part_floats);
		int64_t nchunks = backward_hop(L, pass, h, hold, dy, dx, partial, &rc);
		if (!rc && nchunks == 0 && h == 0)
			rc = rmoe_pass_zero(L, NULL, acc, L->part_floats, prio, rmoe_task_name("zero-grad", h));
		if (!rc && nchunks > 0 && h >= 1)
			rc = rmoe_pass_accumulate(L, pass, partial, acc, L->part_floats, prio,
			                            rmoe_task_name("grad-accumulate", h));
		if (h >= 1)
			starpu_data_unregister_submit(partial);
		if (rc || N == 1)
			break;

		if (!overlap) {
			starpu_task_wait_for_all();
			if (next)
				rc = relay_weights(L, pass, h, hold, next, tag_w + h);
		}
		if (!rc && h < N - 1) {
			rc = send_hop(L, pass, acc, CREDIT_GRADIENTS, h + 1, FIRST_GRADIENTS, tag_g + h + 1, prio + 1);
			if (!rc && !overlap)
				rc = recv_hop(L, pass, gb[(h + 1) % W], CREDIT_GRADIENTS, h + 1, FIRST_GRADIENTS,
				              tag_g + h + 1);
		} else if (!rc) {
			/* The gradient-only return: rank at position i finishes the G of
			 * position i+1's partition and hands it to its owner. */
			rc = rmoe_ring_send(L, pass, acc, 0, tag_final, prio + 1);
			if (!rc)
				rc = rmoe_ring_relay(L, pass, RELAY_RETURN, 0, L->part_floats, L->act, tag_final, prio + 1);
			if (!rc)
				rc = rmoe_ring_recv(L, pass, L->h_dw_part, tag_final);
		}
		if (!rc && !overlap && next) {
			rc = rmoe_wait_data(pass->wait, next);
			if (!rc)
				rc = rmoe_wait_data(pass->wait, gb[(h + 1) % W]);
		}
	}
	slots_hold(pass, rb, nrb);
	slots_hold(pass, gb, ngb);
	return rc;
}
