/* The all-to-all dispatchers' plan (alltoall_plan.c): who sends what to
 * whom, from every rank's expert counts, built once by a layer's forward
 * and kept for its backward; and the helpers their graphs share. Private to
 * graph/. */
#ifndef RMOE_ALLTOALL_H
#define RMOE_ALLTOALL_H

#include "rmoe_dispatch.h"

/* Tags of a pass beyond its first (the counts'): kind k, block chunk j at
 * tag_base + 1 + k * max_chunks + j. Kinds 0-6 are the graphs' transfers
 * (a2a-deepep's backward has six), the last the receivers' credits. */
enum { RMOE_A2A_KIND_CREDIT = 7, RMOE_A2A_KINDS = 8 };

struct rmoe_a2a_plan {
	int N, me;
	int64_t *send_first, *send_rows;  /* [N] my pairs routed to partition q */
	int64_t *recv_rows;               /* [N] q's pairs routed to my partition */
	int64_t *chunk_rows;              /* [N * e_local] rows of (peer q, local expert e) */
	int64_t *rows_per_expert;         /* [e_local] over all peers */
	int64_t M;                        /* rows my experts compute */
	/* a2a-deepep: [N] the distinct tokens of my block for q, and of q's
	 * block for me (from the peer counts); zeros for the others. */
	int64_t *send_tokens, *recv_tokens;
	int32_t *peer_counts;             /* [N * rmoe_counts_width]: each rank's counts */
	int64_t *peer_offsets;            /* [N * (E + 1)]: prefix sums of each rank's counts */
	/* [M]: for the received rows in peer order (peer, local expert, row),
	 * their place among the rows sorted by (local expert, peer). */
	int32_t *unsort_map;
	/* The blocks in chunks of at most the layer's chunk rows (a whole
	 * block without): send[q] of my pairs for q (rows of my pair order),
	 * recv[q] of q's pairs for me (rows of q's pair order: the same split
	 * q makes of its send[me]). */
	struct rmoe_chunk **send, **recv;
	int64_t *nsend, *nrecv;
	int64_t max_recv_rows;            /* the largest received chunk */
};

/* Exchanges the expert counts (the host's one wait of a layer call: it
 * sizes the buffers with them) and plans the exchanges into L->a2a,
 * replacing an earlier plan. */
int rmoe_a2a_plan_build(struct rmoe_layer *L, struct rmoe_pass *pass);
/* The forward's plan for its backward: the same routing, so the same
 * counts; RMOE_ESTATE without one. */
int rmoe_a2a_plan_get(struct rmoe_layer *L, const struct rmoe_a2a_plan **p);
void rmoe_a2a_plan_free(struct rmoe_a2a_plan *p);

/* Tags a pass of L reserves: the counts' and the chunked exchanges'. */
int64_t rmoe_a2a_tags(const struct rmoe_layer *L);
/* The tag of chunk j of a block, of kind kind (< RMOE_A2A_KINDS). */
int64_t rmoe_a2a_tag(const struct rmoe_layer *L, const struct rmoe_pass *pass, int kind, int64_t j);

/* The kept fences that bound the chunks in flight of one role of a rank
 * (depth of them, rmoe_a2a_depth in scheduler/rmoe_memory_model.h): the
 * next chunk's first task waits for the one depth chunks before. */
struct rmoe_a2a_depth {
	struct starpu_task **done;        /* [depth], for the run */
	int64_t n, depth;
	/* The owner of experts computes one chunk at a time, as a ring hop
	 * (the window of window.c): a chunk's expert task waits for the one
	 * before, whose end this kept fence marks. */
	struct starpu_task *computed;
};
static inline struct starpu_task *rmoe_a2a_depth_wait(const struct rmoe_a2a_depth *d)
{
	return d->n >= d->depth ? d->done[d->n % d->depth] : NULL;
}
static inline void rmoe_a2a_depth_push(struct rmoe_a2a_depth *d, struct starpu_task *t)
{
	d->done[d->n % d->depth] = t;
	d->n++;
}
/* The last fence pushed (NULL before any). */
static inline struct starpu_task *rmoe_a2a_depth_last(const struct rmoe_a2a_depth *d)
{
	return d->n > 0 ? d->done[(d->n - 1) % d->depth] : NULL;
}

/* Fresh receive handles h[0..n) from peer, chunk j, kinds kind0 + k,
 * posted (and so allocated) only after the task after; watched. With
 * grant, a credit for chunk j goes to peer once they are posted, and the
 * peer sends only after it (rmoe_a2a_sends): no message of the chunk
 * reaches this rank before its receive is posted, so none is kept as
 * StarPU-MPI's early data (flow.c), outside StarPU's accounting and the
 * memory model. With posted, the fence that posts them is kept there. */
int rmoe_a2a_post_recvs(struct rmoe_layer *L, struct rmoe_pass *pass, const starpu_data_handle_t *h, int n, int peer,
                        int kind0, int64_t j, int grant, struct starpu_task *after, struct starpu_task **posted,
                        const char *const *what);
/* Sends h[0..n) to peer, chunk j, kinds kind0 + k; watched. With
 * credited, once peer's credit for chunk j has come and after the task
 * after (may be NULL). The results need none: their receives are posted
 * before the chunk's inputs leave. */
int rmoe_a2a_sends(struct rmoe_layer *L, struct rmoe_pass *pass, const starpu_data_handle_t *h, int n, int peer,
                   int kind0, int64_t j, int credited, struct starpu_task *after, int prio, const char *const *what);
/* The credit words a pass of plan p needs (one per chunk sent and per
 * chunk received from a peer), reserved in pass. */
int rmoe_a2a_reserve_credits(const struct rmoe_a2a_plan *p, struct rmoe_pass *pass);
/* A fence kept to the pass's end that ends once every earlier access of
 * the n handles h has (a send's included); the handles are then released,
 * a sent one freed as soon as the fence ends. */
int rmoe_a2a_done(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t *h, int n,
                  struct starpu_task **done);
/* The n handles h (NULL ones skipped) unregistered and set to NULL, each
 * invalidated first so that a sent buffer is freed as soon as its last
 * access (a send's) ends, not after the tasks that follow have started. */
void rmoe_a2a_release_sent(starpu_data_handle_t *h, int n);

/* Rows of width elements of src (x or dy: topk K; the routing weights:
 * width 1, topk 1) of my pairs [first, first + rows), after the task after. */
int rmoe_a2a_gather(struct rmoe_layer *L, starpu_data_handle_t src, int64_t width, int64_t topk, int64_t first,
                    int64_t rows, starpu_data_handle_t out, struct starpu_task *after, int prio, const char *name);

/* 0, 1, ..., n-1: the pair order of rows that are their own pairs (K = 1),
 * host memory of the layer, grown before a pass registers any of it (a
 * growth moves it), then registered for each chunk (n at most the grown
 * size; counted by the caller). */
int rmoe_a2a_identity_grow(struct rmoe_layer *L, int64_t n);
starpu_data_handle_t rmoe_a2a_identity(struct rmoe_layer *L, int64_t n);

/* One pass of an all-to-all graph on the plan, its steps in the exchange
 * order (rmoe_exchange_order, scheduler/exchange_order.c): at step 0 a
 * rank's own chunks, at step i its chunks for the rank it sends to, then
 * the chunks for its experts of the rank it receives from; the depths of
 * both roles shared by all of them. */
struct rmoe_a2a_run {
	struct rmoe_layer *L;
	struct rmoe_pass *pass;
	const struct rmoe_a2a_plan *p;
	starpu_data_handle_t dy, out;     /* forward: out = y; backward: dy, out = dx */
	int accumulate;                   /* backward: the weight gradient has its first term */
	struct rmoe_a2a_depth tokens, experts;
};
/* A step on chunk j of a block (c), with peer the rank it goes to (own,
 * token) or comes from (expert). */
typedef int (*rmoe_a2a_step)(struct rmoe_a2a_run *r, int peer, int64_t j, const struct rmoe_chunk *c, int prio);
struct rmoe_a2a_steps {
	rmoe_a2a_step own, token, expert;
};
/* The forward: the plan built (the counts exchange), credits reserved, the
 * steps submitted. */
int rmoe_a2a_forward_run(struct rmoe_a2a_run *r, const struct rmoe_a2a_steps *s);
/* The backward on the forward's plan: dg zeroed, the identity pair order
 * of the largest received chunk, or of the own block only (own_identity),
 * grown and counted, then the steps. */
int rmoe_a2a_backward_run(struct rmoe_a2a_run *r, const struct rmoe_a2a_steps *s, int own_identity);

/* The lean all-to-all's step 0, a rank's own chunk c of its pairs
 * (alltoall_fwd.c, alltoall_bwd.c): no transfer, one chunk on the experts
 * at a time. a2a-deepep's own block is the same. */
int rmoe_a2a_own_forward(struct rmoe_a2a_run *r, int peer, int64_t j, const struct rmoe_chunk *c, int prio);
int rmoe_a2a_own_backward(struct rmoe_a2a_run *r, int peer, int64_t j, const struct rmoe_chunk *c, int prio);

#endif /* RMOE_ALLTOALL_H */
