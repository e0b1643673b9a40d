/* graph/: the task graphs of one MoE layer (ring expert routing, the
 * all-to-all baseline) and the context and layer objects behind the public
 * API. Knows StarPU handles and StarPU-MPI transfers; knows no BLAS. */
#ifndef RMOE_GRAPH_H
#define RMOE_GRAPH_H

#include <mpi.h>
#include <starpu.h>
#include <starpu_mpi.h>
#include <stdint.h>

#include "relaymoe/relaymoe.h"
#include "rmoe_plan.h"
#include "rmoe_scheduler.h"

struct rmoe_ctx {
	MPI_Comm comm;            /* StarPU-MPI's communicator: every transfer rides it */
	int rank, size;
	int local_rank, local_size;   /* ranks sharing this node */
	int started_mpi;          /* what rmoe_ctx_create started, and must stop */
	int started_starpu_mpi;
	int dup_comm;             /* comm is our duplicate, freed on destroy */
	int verbose;
	int64_t tag_first, tag_last, tag_next;  /* tag window, see tags.c */
	int nlayers;              /* layers alive, for a clean destroy */
	int *ring;                /* planned ring order: ring[i] = rank at position i */
	struct rmoe_ring_edge *edges; /* ring[i] -> ring[i+1]: link, bandwidth, latency */
	double device_tflops;     /* planning rate of one rank's device (fp32) */
};

/* One pass (forward or backward) of a layer: what its graph needs to know
 * and what it reports back. */
struct rmoe_pass {
	int backward;
	int64_t tag_base;
	int64_t bytes_sent;
	int64_t largest_temporary;
	int64_t resident;         /* bytes registered from host memory for this pass */
	struct starpu_task *window;   /* see submit.c */
	struct starpu_task *gate;     /* the next expert backward waits for it (submit.c) */
	struct starpu_task **anchors;
	int nanchors, capanchors;
	starpu_data_handle_t *held;   /* relay buffers kept to the end of the pass */
	int nheld, capheld;
};

/* Destroys the pass's dependency anchors and unregisters the buffers it
 * holds; after every task has ended. */
void rmoe_pass_release(struct rmoe_pass *pass);

/* A ring's relay buffer (weights, gradients, travelling tokens) stays
 * allocated until the pass ends instead of being freed when its last
 * transfer completes: the peak then does not depend on when the network
 * finishes a send, and the memory model can count it exactly. */
int rmoe_pass_hold(struct rmoe_pass *pass, starpu_data_handle_t h);

/* The routing of one token partition as the graphs use it: the pair order
 * (pairs sorted by expert), the routing weights, the dg accumulator, and the
 * per-expert offsets into the pair order (host, E+1 entries). A layer's own
 * tokens have one; with token routing, visiting partitions have theirs. */
struct rmoe_routing {
	starpu_data_handle_t pair_order, topk_w, dg;
	const int64_t *offsets;
};

struct rmoe_layer {
	rmoe_ctx *ctx;
	struct rmoe_layer_config cfg;
	enum rmoe_dispatch dispatch;
	int64_t H, F, E, K, T, Fs;
	int N;                    /* ranks in the expert-parallel group */
	int64_t e_local;          /* experts per partition (E / N) */
	int64_t first_expert;     /* of the partition this rank owns */
	int64_t part_floats;      /* floats of one partition's weights */

	/* Ring order from the plan: ring[i] is the rank at position i; the
	 * partition a rank owns carries that rank's number. */
	int *ring;
	int ring_pos, left, right;

	/* Host memory the layer owns across calls. */
	float *w_router, *dw_router;
	float *w_part, *dw_part;          /* owned partition: weights and gradient */
	float *ws, *dws;                  /* shared expert: gate | up | down */
	float *x_saved;                   /* §3.3: forward saves x and the routing only */
	float *probs, *topk_w, *dg;
	int32_t *topk_idx, *pair_order, *expert_counts;
	int64_t *expert_offsets;          /* E+1 prefix sums of expert_counts */

	/* Their handles (home node: main memory), registered once. */
	starpu_data_handle_t h_w_router, h_dw_router, h_w_part, h_dw_part, h_ws, h_dws;
	starpu_data_handle_t h_x, h_probs, h_topk_idx, h_topk_w, h_dg, h_pair_order, h_counts;
	struct rmoe_routing own;          /* this rank's tokens: the handles above */
	int64_t resident_bytes;

	int have_forward;
	int have_shared_weights;
	char dispatch_reason[384];        /* why this dispatch (RMOE_DISPATCH_AUTO) */
	struct rmoe_layer_stats stats;
};

/* ---- helpers shared by the graphs (layer.c) ----------------------------- */

/* A temporary vector handle of n elements of elsize bytes, allocated by
 * StarPU when its first task runs and freed after unregister_submit once its
 * last task ends. Tracks the largest one in pass. */
starpu_data_handle_t rmoe_temp_vector(struct rmoe_pass *pass, int64_t n, size_t elsize);

/* Register a host buffer for the duration of a pass. */
starpu_data_handle_t rmoe_host_vector(struct rmoe_pass *pass, void *ptr, int64_t n, size_t elsize);

/* Transfers, counted in the pass. Priority favours the ring's critical path. */
int rmoe_send(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t h, int dest,
              int64_t tag, int prio);
int rmoe_recv(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t h, int src,
              int64_t tag);

/* Waits until every task and transfer writing h has completed. */
int rmoe_wait_data(starpu_data_handle_t h);

/* Every rank's expert counts (the "tokens per expert" exchange), into all
 * [N * E], rank order; blocks until they are here: the host sizes buffers
 * from them. */
int rmoe_exchange_counts(struct rmoe_layer *L, struct rmoe_pass *pass, int64_t tag, int32_t *all);

/* Simulation (sim_routing.c): a rank's synthetic expert counts, T*K pairs
 * over E experts, the same on every rank that computes them. */
void rmoe_sim_expert_counts(int64_t tokens, int64_t topk, int64_t experts, int rank, int32_t *counts);

/* Pairs routed to the experts [e0, e0+ne): their slice of a pair order with
 * per-expert offsets. */
static inline int64_t rmoe_pairs_first(const int64_t *offsets, int64_t e0)
{
	return offsets[e0];
}
static inline int64_t rmoe_pairs_count(const int64_t *offsets, int64_t e0, int64_t ne)
{
	return offsets[e0 + ne] - offsets[e0];
}

/* One chunk of a partition's pairs: rows [first, first+rows) of pair_order,
 * with the rows of each local expert. */
struct rmoe_chunk {
	int64_t first, rows;
	int64_t *rows_per_expert;     /* e_local entries */
};

/* Split the pairs routed to expert partition p (of the token partition whose
 * offsets are given) into chunks of at most max_rows rows (0 = one chunk).
 * Returns the count; *chunks is malloc'ed. No pair gives 0 chunks. */
int64_t rmoe_partition_chunks(const struct rmoe_layer *L, const int64_t *offsets, int p,
                              int64_t max_rows, struct rmoe_chunk **chunks);
void rmoe_chunks_free(struct rmoe_chunk *chunks, int64_t n);

/* Task insertion (submit.c). Gathers given a pass wait for its window;
 * expert tasks given an anchor pass become its window. */
int rmoe_insert_failed(const char *what, int ret);
int rmoe_clamp_prio(int prio);
int rmoe_submit_gather(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_routing *rt,
                       starpu_data_handle_t src, int64_t first, int64_t count, int weighted,
                       starpu_data_handle_t rows, int prio, const char *name);
int rmoe_submit_scatter_add(struct rmoe_layer *L, const struct rmoe_routing *rt,
                            starpu_data_handle_t rows, int64_t first, int64_t count, int weighted,
                            starpu_data_handle_t dst, int prio, const char *name);
int rmoe_submit_expert_ffn(struct rmoe_layer *L, struct rmoe_pass *anchor, starpu_data_handle_t rows,
                           starpu_data_handle_t w, int64_t n_experts, int64_t ffn,
                           const int64_t *rows_per_expert, int64_t nrows, starpu_data_handle_t work,
                           starpu_data_handle_t out, int prio, const char *name);
int rmoe_submit_expert_bwd_pairs(struct rmoe_layer *L, struct rmoe_pass *anchor,
                                 const struct rmoe_routing *rt, starpu_data_handle_t xrows, starpu_data_handle_t dyrows,
                                 starpu_data_handle_t w, const struct rmoe_chunk *c,
                                 starpu_data_handle_t work, starpu_data_handle_t dx,
                                 starpu_data_handle_t dw, int accumulate, int prio, const char *name);
int rmoe_submit_expert_bwd_preweighted(struct rmoe_layer *L, starpu_data_handle_t xrows,
                                       starpu_data_handle_t doutrows, starpu_data_handle_t w,
                                       int64_t n_experts, int64_t ffn,
                                       const int64_t *rows_per_expert, int64_t nrows,
                                       starpu_data_handle_t work, starpu_data_handle_t dxrows,
                                       starpu_data_handle_t dw, int prio, const char *name);
/* With gate_pass, the accumulate becomes that pass's gate. */
int rmoe_submit_accumulate(struct rmoe_pass *gate_pass, starpu_data_handle_t src, starpu_data_handle_t dst,
                           int64_t count, int prio, const char *name);
/* With pass, the zeroing (which allocates a fresh buffer) waits for its window. */
int rmoe_submit_zero(struct rmoe_pass *pass, starpu_data_handle_t dst, int64_t count, int prio,
                     const char *name);

/* "op hN": a task name that lives as long as the process (StarPU keeps the
 * pointer); hop < 0 gives the bare op. */
const char *rmoe_task_name(const char *op, int hop);

/* ---- the graphs ---------------------------------------------------------- */

/* Both are called after the router and dispatch map of this pass are
 * submitted and the expert counts are known on the host. They submit every
 * task and transfer of the dispatch and return; the caller waits. */
int rmoe_ring_expert_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y);
int rmoe_ring_expert_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                              starpu_data_handle_t dx);
int rmoe_ring_token_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y);
int rmoe_ring_token_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                             starpu_data_handle_t dx);
int rmoe_alltoall_forward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t y);
int rmoe_alltoall_backward(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dy,
                           starpu_data_handle_t dx);

/* ---- tags ------------------------------------------------------------------ */

/* Reserve count consecutive StarPU-MPI tags for one pass. All ranks call it
 * in the same order, so they agree on the block. */
int rmoe_tags_reserve(rmoe_ctx *ctx, int64_t count, int64_t *base);

/* ---- priorities -------------------------------------------------------------- */
/* Earlier hops first; transfers above the compute of their hop. */
static inline int rmoe_prio_hop(int hop, int nhops)
{
	return 2 * (nhops - hop);
}

#endif
