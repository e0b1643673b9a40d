/* Codelets of relaymoe: the kernels of one MoE layer, as StarPU codelets.
 *
 * Every buffer is a StarPU vector handle of float32 or int32 elements; shapes
 * travel in the argument struct (STARPU_CL_ARGS, freed by StarPU). Matrices are
 * row-major. The codelets know StarPU and BLAS, never MPI.
 *
 * Pair indexing. The router picks K experts per token; pair p = t*K + k is
 * token t's k-th choice. dispatch_map sorts all T*K pairs by expert (stable:
 * ascending p within one expert), into pair_order. The pairs routed to the
 * experts of one partition are then a contiguous slice [first, first+count)
 * of pair_order, sub-ordered by expert: a grouped GEMM over the partition
 * needs only the per-expert row counts.
 *
 * Expert weights of a partition (n_experts experts) are one buffer:
 *   gate [n_experts][H][F] | up [n_experts][H][F] | down [n_experts][F][H]
 * and weight gradients use the same layout.
 *
 * Expert workspace ("work") of m rows, block-major, each block [m][F]:
 *   gate pre-activation | up pre-activation | act = silu(gate)*up | u
 * forward and recompute write the first three blocks; the pair-weighted
 * backward also uses the fourth (u = dy w_down^T).
 */
#ifndef RMOE_CODELETS_H
#define RMOE_CODELETS_H

#include <stdint.h>
#include <starpu.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- router ------------------------------------------------------------ */

/* router_fwd buffers: 0 x [T*H] R, 1 w_router [H*E] R, 2 probs [T*E] W,
 *                     3 topk_idx [T*K] int32 W, 4 topk_w [T*K] W.
 * logits = x w_router; probs = softmax(logits) (fp32, max-subtracted);
 * topk_idx[t] = the K largest probs (descending; ties: lower expert first);
 * topk_w = those probs, divided by their sum when norm_topk. */
/* router_bwd buffers: 0 x R, 1 w_router R, 2 probs R, 3 topk_idx R,
 *                     4 topk_w R, 5 dg [T*K] R, 6 dx [T*H] RW (+=),
 *                     7 dw_router [H*E] W (overwritten),
 *                     (8 dprobs [T*E] R: a gradient on probs added to the
 *                     one from dg, e.g. of a load-balancing loss).
 * dp from dg through the (optional) renormalisation, dlogits = p*(dp - <p,dp>),
 * dw_router = x^T dlogits, dx += dlogits w_router^T. The top-k choice itself
 * is not differentiated. */
struct rmoe_router_args {
	int64_t tokens, hidden, experts, topk;
	int norm_topk;
};

/* ---- dispatch map ------------------------------------------------------ */

/* buffers: 0 topk_idx [T*K] R, 1 pair_order [T*K] int32 W,
 *          2 expert_counts [E] int32 W. Counting sort of pairs by expert. */
struct rmoe_dispatch_map_args {
	int64_t tokens, topk, experts;
};

/* ---- gather / scatter-add ---------------------------------------------- */

/* gather buffers: 0 src [T*H] R, 1 pair_order R, 2 rows [count*H] W,
 *                 (3 topk_w R when weighted).
 * rows[i] = src[pair_order[first+i] / K]  (* topk_w[pair_order[first+i]]). */
/* scatter_add buffers: 0 rows [count*H] R, 1 pair_order R,
 *                 2 dst [T*H] RW|COMMUTE, (3 topk_w R when weighted).
 * dst[pair_order[first+i] / K] += (topk_w[...] *) rows[i]. */
struct rmoe_rows_args {
	int64_t first, count, hidden, topk;
	int weighted;
};

/* ---- expert FFN (grouped over one partition) --------------------------- */

/* expert_ffn buffers: 0 rows [m*H] R, 1 weights (partition) R,
 *                     2 work [m*3F] W, 3 out [m*H] W.
 * expert_recompute: the same without buffer 3 (stops after act): the §3.3
 * reconstruction of a hop's intermediates. Its work may also be the [m*4F]
 * workspace of the pair-weighted backward (the first three blocks written).
 * Rows are grouped by expert: rows_per_expert[e] rows for local expert e, in
 * order. */
struct rmoe_expert_args {
	int64_t hidden, ffn, n_experts, rows;
	int mode;                       /* expert_bwd only, enum rmoe_expert_bwd_mode */
	int accumulate;                 /* expert_bwd: 0 = dweights overwritten (experts
	                                   with no rows zeroed), 1 = added to */
	int64_t first, topk;            /* pair-weighted backward: slice of pair_order */
	int64_t rows_per_expert[];      /* n_experts entries, summing to rows */
};

/* expert_bwd, two modes.
 * RMOE_BWD_PAIR_WEIGHTED (ring, §3.3): dy rows unweighted, routing weights read
 *   per pair. buffers: 0 x rows [m*H] RW (consumed: they end as the rows'
 *   dx), 1 dy rows [m*H] R, 2 weights R, 3 pair_order R, 4 topk_w R, 5 work
 *   [m*4F] RW (first 3 blocks from expert_recompute), 6 dx [T*H] RW|COMMUTE
 *   (each row's dx added at its token), 7 dg [T*K] RW|COMMUTE (pairs of the
 *   slice written), 8 dweights (partition layout) W.
 *   u = dy w_down^T; dg[p] = <u, act>; dw_down = (g*act)^T dy; dact = g*u;
 *   SwiGLU backward; dw_gate/up = x^T dpre; dx[t] += dpre_gate w_gate^T +
 *   dpre_up w_up^T. Writing the rows' dx over the consumed x rows and adding
 *   them in place saves a hop's dx rows buffer and a scatter-add task.
 * RMOE_BWD_PREWEIGHTED (all-to-all, shared expert): dout rows already carry g.
 *   buffers: 0 x rows R, 1 dout rows R, 2 weights R, 3 work [m*3F] RW (saved
 *   forward intermediates), 4 dx rows W, 5 dweights W.
 * Both modes: dweights is inserted STARPU_RW when accumulate = 1. work is
 * consumed: on return it holds dpre_gate | dpre_up | g*act | g*u
 * (pair-weighted) or dpre_gate | dpre_up | dact (preweighted). */
enum rmoe_expert_bwd_mode {
	RMOE_BWD_PAIR_WEIGHTED = 0,
	RMOE_BWD_PREWEIGHTED = 1,
};

/* ---- small ops ---------------------------------------------------------- */

/* accumulate buffers: 0 src R, 1 dst RW. dst += src (count floats). */
struct rmoe_accumulate_args {
	int64_t count;
};

/* sort_chunks (all-to-all "sort by local expert" and its inverse).
 * Input chunks come from n_peers peers; chunk (q, e) holds counts[q*n_experts+e]
 * rows of local expert e from peer q. A peer with no rows at all has no
 * buffer: per-peer buffers are given only for peers with rows, in peer order,
 * so with n_active such peers "n_peers" below reads n_active (the task has
 * n_active + 1 buffers).
 * RMOE_SORT_BY_EXPERT:   buffers 0..n_peers-1 per-peer R, n_peers sorted W;
 *                        sorted order is (e, q).
 * RMOE_UNSORT_TO_PEERS:  buffer 0 sorted R, 1..n_peers per-peer W. */
enum rmoe_sort_direction {
	RMOE_SORT_BY_EXPERT = 0,
	RMOE_UNSORT_TO_PEERS = 1,
};
struct rmoe_sort_args {
	int64_t hidden, n_peers, n_experts;
	int direction;
	int64_t counts[];               /* n_peers * n_experts */
};

/* unpermute_bwd (all-to-all combine backward) buffers: 0 dy [T*H] R,
 *   1 back rows [count*H] R (expert outputs returned to this rank),
 *   2 pair_order R, 3 topk_w R, 4 dout rows [count*H] W, 5 dg [T*K] RW|COMMUTE.
 * dout[i] = g[p] dy[t]; dg[p] = <dy[t], back[i]>, p = pair_order[first+i]. */
/* (uses struct rmoe_rows_args; weighted is ignored) */

/* zero buffers: 0 dst W. dst = 0 (count floats); an empty contribution, e.g.
 * the gradient of a partition no local pair was routed to. */
/* (uses struct rmoe_accumulate_args) */

/* ---- the codelets ------------------------------------------------------- */

/* Codelets with a fixed number of buffers declare the modes above, and
 * starpu_task_insert must pass the same ones. gather, scatter_add,
 * expert_bwd and sort_chunks have STARPU_VARIABLE_NBUFFERS: their modes come
 * with the insertion. */

extern struct starpu_codelet rmoe_cl_router_fwd;
extern struct starpu_codelet rmoe_cl_router_bwd;
extern struct starpu_codelet rmoe_cl_dispatch_map;
extern struct starpu_codelet rmoe_cl_gather;
extern struct starpu_codelet rmoe_cl_scatter_add;
extern struct starpu_codelet rmoe_cl_expert_ffn;
extern struct starpu_codelet rmoe_cl_expert_recompute;
extern struct starpu_codelet rmoe_cl_expert_bwd;
extern struct starpu_codelet rmoe_cl_accumulate;
extern struct starpu_codelet rmoe_cl_zero;
extern struct starpu_codelet rmoe_cl_sort_chunks;
extern struct starpu_codelet rmoe_cl_unpermute_bwd;

/* Size of struct rmoe_expert_args / rmoe_sort_args with their tails. */
size_t rmoe_expert_args_size(int64_t n_experts);
size_t rmoe_sort_args_size(int64_t n_peers, int64_t n_experts);

/* Flop counts, for STARPU_FLOPS and the benchmarks. */
double rmoe_flops_expert_ffn(int64_t rows, int64_t hidden, int64_t ffn, int with_down);
double rmoe_flops_expert_bwd(int64_t rows, int64_t hidden, int64_t ffn, int mode);
double rmoe_flops_router(int64_t tokens, int64_t hidden, int64_t experts);

/* One-time set-up of the kernels' environment (BLAS threads: one per worker,
 * since StarPU owns the cores). Idempotent. */
void rmoe_codelets_init(void);

/* ---- memory probe ------------------------------------------------------- */

/* Every codelet samples, on entry (when all its buffers are allocated), the
 * bytes StarPU holds in main memory; the graph reads the running maximum.
 * StarPU 1.3 has no peak counter (see ../shared/notes), hence sampling. */
void rmoe_probe_sample(void);
void rmoe_probe_reset(void);
int64_t rmoe_probe_peak(void);
int64_t rmoe_probe_current(void);

#ifdef __cplusplus
}
#endif

#endif /* RMOE_CODELETS_H */
