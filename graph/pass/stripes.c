/* Striped ring transfers (beyond the paper; scheduler/stripes.c plans
 * them). A hop whose ring edge leaves a node goes in one piece per network
 * adapter of the node: piece 0 straight to the right neighbour, piece j
 * over the GPU link to the rank that owns adapter j (its out relay), over
 * that rank's network link to its counterpart on the next node (the in
 * relay), and over the GPU link to the receiver. The pieces are StarPU
 * data: a partition of the buffer (a vector cut in n blocks), read-only at
 * the sender so the hop's compute reads the buffer meanwhile, written at
 * the receiver, where undoing the partition makes every reader of the
 * buffer wait for every piece.
 *
 * The sender's partition stays active after the sends: StarPU 1.3's
 * unpartition is a task that writes the parent, so submitting it at once
 * made the hop's own compute, a reader of the buffer submitted after the
 * send, wait for every piece to leave (a crossing sender started each
 * pass a piece's network time late, and every rank waited for it at the
 * pass's end). The buffer is unpartitioned before its next writer instead
 * (rmoe_ring_settle: the receive into the slot, and the rings before the
 * credit fences that write it; the pass's end for the rest).
 *
 * Legs of a piece have tags of their own: tag (piece 0), and tag plus one,
 * two and three blocks of RMOE_PASS_TAGS for the sender's, the network's
 * and the in relay's leg, so no rank receives two messages of one source
 * on one tag (a rank of a two-node ring is an in relay of one edge and a
 * receiver of the other, from the same neighbour).
 *
 * A relay holds its pieces in its window's slots (one per hop mod window
 * and kind), so a piece's receive is posted once the slot's piece of W
 * hops before has left. As the receiver grants its slot to the sender
 * (flow.c), a relay grants its slot upstream (to the sender, or to the out
 * relay) and the upstream's piece waits for that credit: no piece arrives
 * before its receive is posted, which StarPU-MPI would keep meanwhile
 * (early data) outside the accounting. The credits' tags: two blocks
 * more. */
#include <stdlib.h>
#include <string.h>

#include "rmoe_buffers.h"
#include "rmoe_pass.h"
#include "rmoe_tasks.h"
#include "rmoe_transfers.h"

static int64_t leg_tag(const struct rmoe_layer *L, int64_t tag, int leg)
{
	return tag + (int64_t)leg * RMOE_PASS_TAGS(L->N);
}

/* Elements of piece j of n elements cut in parts, as
 * starpu_vector_filter_block cuts them. */
static int64_t piece_elements(int64_t n, int parts, int j, size_t elsize)
{
	uint32_t size = 0;
	size_t offset = 0;
	starpu_filter_nparts_compute_chunk_size_and_offset((unsigned)n, (unsigned)parts, elsize, (unsigned)j, 1, &size,
	                                                   &offset);
	return size;
}

/* The pass's plan of h in n pieces, made at its first use. */
static struct rmoe_split *split_of(struct rmoe_pass *pass, starpu_data_handle_t h, int n)
{
	for (int i = 0; i < pass->nsplits; i++)
		if (pass->splits[i].parent == h && pass->splits[i].n == n)
			return &pass->splits[i];
	if (rmoe_pass_room(&pass->splits, &pass->capsplits, pass->nsplits, sizeof(*pass->splits), 8))
		return NULL;
	struct rmoe_split *s = &pass->splits[pass->nsplits++];
	memset(s, 0, sizeof(*s));
	s->parent = h;
	s->n = n;
	struct starpu_data_filter f = {.filter_func = starpu_vector_filter_block, .nchildren = (unsigned)n};
	starpu_data_partition_plan(h, &f, s->pieces);
	/* Each piece is a handle of StarPU's, as the runtime's structures
	 * count them (codelets/probe/bookkeeping.c). */
	for (int j = 0; j < n; j++)
		rmoe_bookkeeping_count_handle();
	return s;
}

void rmoe_ring_settle(struct rmoe_pass *pass, starpu_data_handle_t h)
{
	for (int i = 0; i < pass->nsplits; i++) {
		struct rmoe_split *s = &pass->splits[i];
		if (s->parent == h && s->sending) {
			starpu_data_unpartition_submit(h, (unsigned)s->n, s->pieces, -1);
			s->sending = 0;
		}
	}
}

/* Whether the relays' slots of hop rh were used before (credits). */
static int relay_credit(const struct rmoe_layer *L, int rh)
{
	return L->flow_credits && rh > L->window;
}

int rmoe_ring_send(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t h, int rh, int64_t tag,
                   int prio)
{
	const int e = L->ring_pos, n = L->stripe_count[e];
	if (n < 2)
		return rmoe_send(L, pass, h, L->right, tag, prio, NULL, NULL);
	struct rmoe_split *s = split_of(pass, h, n);
	if (!s)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	int rc = 0;
	if (relay_credit(L, rh)) {
		/* Every out relay's grant, then one gate on the whole buffer. */
		starpu_data_handle_t credits[RMOE_STRIPES_MAX];
		for (int j = 1; j < n && !rc; j++)
			rc = rmoe_flow_await_from(L, pass, L->stripes[e * RMOE_STRIPES_MAX + j].out, leg_tag(L, tag, 4),
			                          &credits[j - 1]);
		if (!rc)
			rc = rmoe_pass_fence(L, pass, credits, n - 1, &h, 1, NULL, NULL, "credit-wait");
		if (rc)
			return rc;
	}
	starpu_data_partition_readonly_submit(h, (unsigned)n, s->pieces);
	for (int j = 0; j < n && !rc; j++)
		rc = j == 0 ? rmoe_send(L, pass, s->pieces[0], L->right, tag, prio, NULL, NULL)
		            : rmoe_send(L, pass, s->pieces[j], L->stripes[e * RMOE_STRIPES_MAX + j].out, leg_tag(L, tag, 1),
		                        prio, NULL, NULL);
	/* Read-only: the buffer's readers go on meanwhile; its next writer
	 * ends the partition first (rmoe_ring_settle). */
	s->sending = 1;
	return rc;
}

int rmoe_ring_recv(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t slot, int64_t tag)
{
	const int e = (L->ring_pos - 1 + L->N) % L->N, n = L->stripe_count[e];
	rmoe_ring_settle(pass, slot);
	if (n < 2)
		return rmoe_recv(L, slot, L->left, tag);
	struct rmoe_split *s = split_of(pass, slot, n);
	if (!s)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	starpu_data_partition_submit(slot, (unsigned)n, s->pieces);
	int rc = 0;
	for (int j = 0; j < n && !rc; j++)
		rc = j == 0 ? rmoe_recv(L, s->pieces[0], L->left, tag)
		            : rmoe_recv(L, s->pieces[j], L->stripes[e * RMOE_STRIPES_MAX + j].in, leg_tag(L, tag, 3));
	starpu_data_unpartition_submit(slot, (unsigned)n, s->pieces, -1);
	return rc;
}

/* The relay's slot of a role and kind for hop h, n elements. */
static starpu_data_handle_t relay_slot(struct rmoe_layer *L, struct rmoe_pass *pass, int role, int kind, int h,
                                       int64_t n, size_t elsize)
{
	const int slot = h % L->window;
	for (int i = 0; i < pass->nrelays; i++) {
		struct rmoe_relay_slot *r = &pass->relays[i];
		if (r->role == role && r->kind == kind && r->slot == slot)
			return r->h;
	}
	if (rmoe_pass_room(&pass->relays, &pass->caprelays, pass->nrelays, sizeof(*pass->relays), 8))
		return NULL;
	starpu_data_handle_t b = rmoe_temp_vector(pass, n, elsize);
	if (!b || rmoe_pass_hold(pass, b))
		return NULL;
	pass->relays[pass->nrelays++] = (struct rmoe_relay_slot){role, kind, slot, b};
	return b;
}

int rmoe_ring_relay(struct rmoe_layer *L, struct rmoe_pass *pass, int kind, int h, int64_t n, size_t elsize,
                    int64_t tag, int prio)
{
	const int me = L->ctx->rank;
	int rc = 0;
	for (int e = 0; e < L->N && !rc && L->striped; e++) {
		const int parts = L->stripe_count[e], from = L->ring[e], to = L->ring[(e + 1) % L->N];
		for (int j = 1; j < parts && !rc; j++) {
			const struct rmoe_stripe *st = &L->stripes[e * RMOE_STRIPES_MAX + j];
			const int64_t elements = piece_elements(n, parts, j, elsize);
			const int credit = relay_credit(L, h);
			if (st->out == me) {
				starpu_data_handle_t b = relay_slot(L, pass, 0, kind, h, elements, elsize), c = NULL;
				rc = b ? 0 : rmoe_error(RMOE_ENOMEM, "out of host memory");
				if (!rc && credit)
					rc = rmoe_flow_grant_to(L, pass, from, leg_tag(L, tag, 4), &b, 1, NULL);
				if (!rc)
					rc = rmoe_recv(L, b, from, leg_tag(L, tag, 1));
				if (!rc && credit)
					rc = rmoe_flow_await_from(L, pass, st->in, leg_tag(L, tag, 5), &c);
				if (!rc && c)
					rc = rmoe_flow_gate(L, pass, c, b);
				if (!rc)
					rc = rmoe_send(L, pass, b, st->in, leg_tag(L, tag, 2), prio, NULL, NULL);
			}
			if (!rc && st->in == me) {
				starpu_data_handle_t b = relay_slot(L, pass, 1, kind, h, elements, elsize);
				rc = b ? 0 : rmoe_error(RMOE_ENOMEM, "out of host memory");
				if (!rc && credit)
					rc = rmoe_flow_grant_to(L, pass, st->out, leg_tag(L, tag, 5), &b, 1, NULL);
				if (!rc)
					rc = rmoe_recv(L, b, st->out, leg_tag(L, tag, 2));
				if (!rc)
					rc = rmoe_send(L, pass, b, to, leg_tag(L, tag, 3), prio, NULL, NULL);
			}
		}
	}
	return rc;
}
