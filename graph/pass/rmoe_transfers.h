/* The transfers of a pass (transfers.c): StarPU-MPI requests, the watch
 * that names a stalled peer, and the expert counts exchange. Private to
 * graph/. */
#ifndef RMOE_TRANSFERS_H
#define RMOE_TRANSFERS_H

#include <starpu.h>
#include <stdint.h>

#include "rmoe_layer_impl.h"
#include "rmoe_pass.h"

/* Every transfer of a layer: StarPU-MPI detached requests on the context's
 * communicator, counted in the pass. done (may be NULL) runs when a send
 * completes. Priority favours the ring's critical path. */
int rmoe_send(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t h, int dest, int64_t tag,
              int prio, void (*done)(void *), void *arg);
int rmoe_recv(struct rmoe_layer *L, starpu_data_handle_t h, int src, int64_t tag);

/* Watches the transfer just submitted of h with peer on tag (received: a
 * receive into h; else a send of h): a fence kept until the pass ends, which
 * ends with the transfer and changes nothing else. A pass whose transfers
 * are not awaited by the host (the all-to-all) names from them the peers it
 * stalled on. Only with a wait_timeout: without one nothing gives up. */
int rmoe_pass_watch(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t h, int peer, int64_t tag,
                    int received, const char *what);

/* Flow control of a ring's relay (flow.c). A ring of L->window slots per
 * relayed kind receives hop h into slot h mod window. StarPU-MPI 1.3 takes a
 * message whose receive is not yet posted into a buffer of its own, outside
 * StarPU's accounting (_starpu_mpi_receive_early_data); so a sender waits
 * for a credit before it sends hop h, which the receiver sends once the
 * slot's earlier hop, h - window, has released it.
 *
 * rmoe_flow_needed: whether the receive of hop h into a ring whose slots
 * are first used at hop first waits for a credit. */
static inline int rmoe_flow_needed(const struct rmoe_layer *L, int h, int first)
{
	return L->flow_credits && h - L->window >= first;
}

/* The credit tag of hop h of kind kind (0 .. RMOE_CREDIT_KINDS-1). */
static inline int64_t rmoe_flow_tag(const struct rmoe_layer *L, const struct rmoe_pass *pass, int kind, int h)
{
	return pass->tag_base + 8 * (int64_t)L->N + 8 + (int64_t)kind * L->N + h;
}

/* Receiver: after every earlier access of slots (n of them, NULL ignored),
 * a credit to the left neighbour on tag. Call before the receives into the
 * slots are submitted, which then wait for the same accesses. */
int rmoe_flow_grant(struct rmoe_layer *L, struct rmoe_pass *pass, int64_t tag, const starpu_data_handle_t *slots,
                    int n);

/* Sender: the receive of the right neighbour's credit on tag, into
 * *credit, for rmoe_flow_gate. */
int rmoe_flow_await(struct rmoe_layer *L, struct rmoe_pass *pass, int64_t tag, starpu_data_handle_t *credit);

/* The same between any two ranks (the all-to-all's, alltoall_plan.c):
 * the grant to peer also after the task after (may be NULL); the credit
 * awaited from peer. */
int rmoe_flow_grant_to(struct rmoe_layer *L, struct rmoe_pass *pass, int peer, int64_t tag,
                       const starpu_data_handle_t *slots, int n, struct starpu_task *after);
int rmoe_flow_await_from(struct rmoe_layer *L, struct rmoe_pass *pass, int peer, int64_t tag,
                         starpu_data_handle_t *credit);
/* Room for n credit words in the pass (before its first credit; a ring's
 * passes need none: 2 * RMOE_CREDIT_KINDS * N by default). */
int rmoe_flow_reserve(struct rmoe_pass *pass, int64_t n);

/* Sender: every later access of h (its send) waits for credit. Call just
 * before the send of h. */
int rmoe_flow_gate(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t credit,
                   starpu_data_handle_t h);

/* Striped ring transfers (stripes.c; scheduler/stripes.c plans them).
 * Where this rank's edge to its right neighbour is striped, h goes in
 * pieces: piece 0 to the neighbour, piece j to the rank that owns adapter
 * j on this node; where its edge from the left is, slot is received in
 * pieces, piece 0 from the left neighbour, piece j from the rank on this
 * node that relays it. Otherwise a plain send or receive. The receiver's
 * readers of slot wait for every piece. rh: the hop the receiver takes it
 * as (relayed kinds start at hop 1; 0: a transfer made once), which says
 * when the relays' slots are reused, so the pieces wait for their
 * credits. */
int rmoe_ring_send(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t h, int rh, int64_t tag,
                   int prio);
int rmoe_ring_recv(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t slot, int64_t tag);

/* A striped send leaves h partitioned, read-only, so that the readers
 * submitted after it need not wait for the pieces to leave; before h is
 * written (received into, or fenced by a credit's write access) the
 * partition must end, which this submits (a no-op where h is not being
 * sent in pieces). rmoe_ring_recv calls it; a ring calls it before a
 * credit's fence writes the buffer (flow.c). */
void rmoe_ring_settle(struct rmoe_pass *pass, starpu_data_handle_t h);

/* Every rank, once per striped transfer of tag, on every rank (hop h of a
 * relayed kind, as rmoe_ring_send's rh; n elements of elsize bytes a
 * cargo): the pieces this rank relays, received into its window's slot
 * for the kind (granted upstream when reused) and sent on (after the
 * next relay's grant). Nothing where no edge is striped. */
int rmoe_ring_relay(struct rmoe_layer *L, struct rmoe_pass *pass, int kind, int h, int64_t n, size_t elsize,
                    int64_t tag, int prio);

/* The tag blocks a pass of a striped layer reserves: the ring's, one per
 * leg of a piece, one per relay's credit. */
#define RMOE_STRIPE_LEGS 6

/* Every rank's expert counts (the "tokens per expert" exchange), into all
 * [N * width], rank order; blocks until they are here: the host sizes
 * buffers from them. width rmoe_counts_width(L): E, or for a2a-deepep E + N
 * (its peer counts, layer.c). */
int rmoe_exchange_counts(struct rmoe_layer *L, struct rmoe_pass *pass, int64_t tag, int32_t *all);
/* The n + 1 offsets of n counts (0, c0, c0 + c1, ...): where each expert's
 * rows start in rows sorted by expert. */
void rmoe_counts_offsets(const int32_t *counts, int64_t n, int64_t *offsets);
int64_t rmoe_counts_width(const struct rmoe_layer *L);
/* The counts the exchange carries: their handle, and their host buffer
 * into *host (the expert counts, or a2a-deepep's peer counts). */
starpu_data_handle_t rmoe_counts_handle(const struct rmoe_layer *L, int32_t **host);
/* Simulation: rank's synthetic counts as the exchange carries them
 * (rmoe_counts_width entries). */
void rmoe_sim_rank_counts(const struct rmoe_layer *L, int rank, int32_t *out);

/* Simulation (sim_routing.c): a rank's synthetic expert counts, T*K pairs
 * over E experts, the same on every rank that computes them. */
void rmoe_sim_expert_counts(int64_t tokens, int64_t topk, int64_t experts, int rank, int32_t *counts);
/* a2a-deepep's peer counts from one rank's drawn expert counts: the
 * distinct tokens a uniform router sends each of ranks ranks. */
void rmoe_sim_peer_tokens(int64_t tokens, int64_t topk, int64_t experts, int64_t ranks, const int32_t *counts,
                          int32_t *out);

#endif /* RMOE_TRANSFERS_H */
