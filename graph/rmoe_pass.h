/* One pass (forward or backward) of a layer, and the helpers the dispatch
 * graphs build it with (pass.c): temporaries, chunks of a partition's pairs,
 * transfers, and tasks inserted under the pass's window and gate. Private
 * to graph/. */
#ifndef RMOE_PASS_H
#define RMOE_PASS_H

#include <starpu.h>
#include <starpu_mpi.h>
#include <stdint.h>

#include "rmoe_codelets.h"
#include "rmoe_collective.h"
#include "rmoe_layer_impl.h"
#include "rmoe_scheduler.h"

/* A transfer of a pass watched for the message of a stalled pass
 * (rmoe_pass_watch). */
struct rmoe_watch {
	struct starpu_task *fence;    /* kept; ends once the transfer has completed */
	int peer;
	int64_t tag;
	const char *what;             /* the data, in the message's words */
};

/* What a pass's graph needs to know and what it reports back. */
struct rmoe_pass {
	int backward;
	int64_t tag_base;
	int64_t bytes_sent;
	int64_t largest_temporary;
	int64_t resident;         /* bytes registered from host memory for this pass */
	int host_waits;           /* made while the dispatch graph was submitted */
	struct starpu_task *window;   /* see pass.c */
	struct starpu_task *gate;     /* the next expert backward waits for it (pass.c) */
	struct starpu_task **anchors;
	int nanchors, capanchors;
	starpu_data_handle_t *held;   /* relay buffers kept to the end of the pass */
	int nheld, capheld;
	struct rmoe_watch *watched;   /* transfers named when the pass stalls */
	int nwatched, capwatched;
};

/* ---- buffers -------------------------------------------------------------------- */

/* A temporary vector handle of n elements of elsize bytes, allocated by
 * StarPU when its first task runs and freed after unregister_submit once its
 * last task ends. Tracks the largest one in pass. */
starpu_data_handle_t rmoe_temp_vector(struct rmoe_pass *pass, int64_t n, size_t elsize);

/* A temporary of n activations or weights (the layer's element type). */
static inline starpu_data_handle_t rmoe_act_vector(struct rmoe_pass *pass, const struct rmoe_layer *L, int64_t n)
{
	return rmoe_temp_vector(pass, n, L->act);
}

/* A host buffer registered (home node: main memory); with pass, counted as
 * the pass's resident bytes. */
starpu_data_handle_t rmoe_host_vector(struct rmoe_pass *pass, void *ptr, int64_t n, size_t elsize);
/* The same on memory node node (an application's buffer on its device);
 * only main memory counts into pass->resident. */
starpu_data_handle_t rmoe_node_vector(struct rmoe_pass *pass, int node, void *ptr, int64_t n, size_t elsize);

/* A ring's relay buffer (weights, gradients, travelling tokens) stays
 * allocated until the pass ends instead of being freed when its last
 * transfer completes: the peak then does not depend on when the network
 * finishes a send, and the memory model can count it exactly. */
int rmoe_pass_hold(struct rmoe_pass *pass, starpu_data_handle_t h);

/* Waits for a pass: its outputs, then every task (temporaries freed), the
 * held relay buffers' last sends, and the owned weights' outgoing
 * transfers; then releases the pass's anchors and held buffers. */
int rmoe_pass_finish(struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t *outs, int nouts);

/* rc, and when it is RMOE_EPEER the message says which peers the rank was
 * waiting for, with their hosts: in the vote that starts a pass, the ranks
 * that never reached it; where the pass watched its transfers
 * (rmoe_pass_watch), the peers of the earliest ones (by tag) that never
 * completed; otherwise, in a ring pass, its left neighbour on the ring,
 * whose relay feeds every hop. */
int rmoe_pass_peer_named(const struct rmoe_layer *L, const struct rmoe_pass *pass, int rc);

/* ---- chunks of a partition's pairs ------------------------------------------------- */

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
 * offsets are given) into chunks of at most max_rows rows (0 = one chunk),
 * each within one of the layer's partitions of p's experts
 * (cfg.partitions). Returns the count; *chunks is malloc'ed. No pair gives
 * 0 chunks. */
int64_t rmoe_partition_chunks(const struct rmoe_layer *L, const int64_t *offsets, int p, int64_t max_rows,
                              struct rmoe_chunk **chunks);
void rmoe_chunks_free(struct rmoe_chunk *chunks, int64_t n);

/* ---- transfers ------------------------------------------------------------------------ */

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

/* Every rank's expert counts (the "tokens per expert" exchange), into all
 * [N * E], rank order; blocks until they are here: the host sizes buffers
 * from them. */
int rmoe_exchange_counts(struct rmoe_layer *L, struct rmoe_pass *pass, int64_t tag, int32_t *all);

/* Simulation (sim_routing.c): a rank's synthetic expert counts, T*K pairs
 * over E experts, the same on every rank that computes them. */
void rmoe_sim_expert_counts(int64_t tokens, int64_t topk, int64_t experts, int rank, int32_t *counts);

/* ---- tasks under the pass's window and gate (pass.c says why) ------------------------- */

/* Options for a task of L named name at priority prio. */
struct rmoe_task_opts rmoe_opts(const struct rmoe_layer *L, const char *name, int prio);

/* Gathers given a pass wait for its window; expert tasks given an anchor
 * pass become its window (and the pair-weighted backward also waits for the
 * gate); an accumulate given a gate pass becomes its gate; a zeroing given a
 * pass waits for its window. */
int rmoe_pass_gather(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_routing *rt,
                     starpu_data_handle_t src, int64_t first, int64_t count, int weighted,
                     starpu_data_handle_t rows, int prio, const char *name);
int rmoe_pass_scatter_add(struct rmoe_layer *L, const struct rmoe_routing *rt, starpu_data_handle_t rows,
                          int64_t first, int64_t count, int weighted, starpu_data_handle_t dst, int prio,
                          const char *name);
int rmoe_pass_expert_ffn(struct rmoe_layer *L, struct rmoe_pass *anchor, starpu_data_handle_t rows,
                         starpu_data_handle_t w, int64_t n_experts, int64_t ffn, const int64_t *rows_per_expert,
                         int64_t nrows, starpu_data_handle_t work, starpu_data_handle_t out, int prio,
                         const char *name);
int rmoe_pass_expert_bwd_pairs(struct rmoe_layer *L, struct rmoe_pass *anchor, const struct rmoe_routing *rt,
                               starpu_data_handle_t xrows, starpu_data_handle_t dyrows, starpu_data_handle_t w,
                               const struct rmoe_chunk *c, starpu_data_handle_t work, starpu_data_handle_t dx,
                               starpu_data_handle_t dw, int accumulate, int prio, const char *name);
int rmoe_pass_accumulate(struct rmoe_pass *gate_pass, starpu_data_handle_t src, starpu_data_handle_t dst,
                         int64_t count, int prio, const char *name);
int rmoe_pass_zero(struct rmoe_pass *pass, starpu_data_handle_t dst, int64_t count, int prio, const char *name);

/* An ordering task of the pass (rmoe_insert_fence: after the writers of
 * ready and every earlier access of next; every later access of next after
 * it), also after the task after (may be NULL). With kept it is kept as an
 * anchor until the pass ends and returned there, for later tasks to wait
 * for (their options' after). */
int rmoe_pass_fence(struct rmoe_layer *L, struct rmoe_pass *pass, const starpu_data_handle_t *ready, int nready,
                    const starpu_data_handle_t *next, int nnext, struct starpu_task *after, struct starpu_task **kept,
                    const char *name);

/* One chunk of a hop, forward (§3.1): gather the chunk's rows of x,
 * grouped SwiGLU over the partition whose weights are w, weighted
 * scatter-add into acc. The rows, workspace and outputs are temporaries
 * freed when their last task ends. */
int rmoe_chunk_forward(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_routing *rt,
                       starpu_data_handle_t x, starpu_data_handle_t w, const struct rmoe_chunk *c,
                       starpu_data_handle_t acc, int prio, int hop);

/* One chunk of a hop, backward (§3.3: reconstruct, consume, release
 * within the hop): gather the rows of x and dy, recompute the
 * intermediates, and the pair-weighted expert backward into dx, rt's dg and
 * the weight gradient dw (added to when accumulate). */
int rmoe_chunk_backward(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_routing *rt,
                        starpu_data_handle_t x, starpu_data_handle_t dy, starpu_data_handle_t w,
                        const struct rmoe_chunk *c, starpu_data_handle_t dx, starpu_data_handle_t dw, int accumulate,
                        int prio, int hop);

/* "op hN": a task name that lives as long as the process (StarPU keeps the
 * pointer); hop < 0 gives the bare op. */
const char *rmoe_task_name(const char *op, int hop);

/* Earlier hops first; transfers above the compute of their hop. */
static inline int rmoe_prio_hop(int hop, int nhops)
{
	return 2 * (nhops - hop);
}

#endif /* RMOE_PASS_H */
