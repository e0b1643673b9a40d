/* The kernels of one MoE layer on plain pointers and sizes, as Chameleon's
 * coreblas is to its codelets: they know nothing of StarPU, MPI or the
 * graph. The CPU kernels (this folder's .c files) compute through CBLAS;
 * the CUDA twins, when built, sit beside them. Every matrix is row-major.
 *
 * Pair indexing. The router picks K experts per token; pair p = t*K + k is
 * token t's k-th choice. The dispatch map sorts all T*K pairs by expert
 * (stable: ascending p within one expert) into pair_order, so the pairs of
 * one partition's experts are one slice [first, first + count) of
 * pair_order, sub-ordered by expert.
 *
 * Expert weights of a partition of ne experts are one buffer
 *   gate [ne][H][F] | up [ne][H][F] | down [ne][F][H]
 * and weight gradients use the same layout (rmoe_kernel_math.h).
 *
 * Expert workspace ("work") of m rows, block-major, each block [m][F]:
 *   gate pre-activation | up pre-activation | act = silu(gate)*up | u
 * forward and recompute write the first three blocks; the pair-weighted
 * backward also uses the fourth (u = dy w_down^T). */
#ifndef RMOE_KERNELS_H
#define RMOE_KERNELS_H

#include <stdint.h>

#include "rmoe_kernel_math.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- router ---------------------------------------------------------------- */

/* logits = x w_router; probs = softmax(logits) (max-subtracted); topk_idx[t]
 * = the K largest probs, descending (ties: lower expert first); topk_w =
 * those probs, divided by their sum when norm_topk. */
void rmoe_kernel_router_fwd(int64_t tokens, int64_t hidden, int64_t experts, int64_t topk, int norm_topk,
                            const float *x, const float *w_router, float *probs, int32_t *topk_idx,
                            float *topk_w);

/* dp from dg through the (optional) renormalisation, plus dprobs (may be
 * NULL: a gradient on the probabilities, e.g. of a load-balancing loss);
 * dlogits = p*(dp - <p,dp>); dw_router = x^T dlogits (overwritten);
 * dx += dlogits w_router^T. The top-k choice is not differentiated.
 * 0, or -1 when its scratch cannot be allocated. */
int rmoe_kernel_router_bwd(int64_t tokens, int64_t hidden, int64_t experts, int64_t topk, int norm_topk,
                           const float *x, const float *w_router, const float *probs,
                           const int32_t *topk_idx, const float *topk_w, const float *dg,
                           const float *dprobs, float *dx, float *dw_router);

/* ---- the shared expert's gate (Qwen2-MoE) --------------------------------------- */

/* A one-logit router: s[t] *= sigmoid(<x[t], w>), s the shared expert's
 * output [T*H], w [H]. */
void rmoe_kernel_shared_gate_fwd(int64_t tokens, int64_t hidden, const float *x, const float *w, float *s);

/* Its backward, s the ungated output (recomputed): with g = sigmoid(<x, w>)
 * and dz = <dy, s> g (1 - g) per token, s becomes g dy (the shared
 * expert's dout), dx += dz w, dw = x^T dz (overwritten). dz [tokens]
 * scratch. */
void rmoe_kernel_shared_gate_bwd(int64_t tokens, int64_t hidden, const float *x, const float *w,
                                 const float *dy, float *s, float *dx, float *dw, float *dz);

/* ---- dispatch map --------------------------------------------------------------- */

/* Counting sort of the pairs by expert: pair_order (pairs) and per-expert
 * counts. -1, or the first pair whose expert index is outside [0, experts)
 * (nothing is then written to pair_order). */
int64_t rmoe_kernel_dispatch_map(int64_t pairs, int64_t experts, const int32_t *topk_idx,
                                 int32_t *pair_order, int32_t *counts);
/* DeepEP-style dispatch (graph/dispatch/alltoall_deepep.c). out [E + N]: the
 * expert counts, then for each of N ranks (E/N experts each) the tokens
 * with at least one pair routed to it. -1, or the first pair whose expert
 * is out of range. */
int64_t rmoe_kernel_peer_counts(int64_t tokens, int64_t topk, int64_t experts, int64_t ranks, const int32_t *topk_idx,
                                const int32_t *counts, int32_t *out);
/* One rank's block, pairs [first, first + count) of pair_order (sorted by
 * expert): tokens [distinct] its distinct tokens ascending, codes [count]
 * each pair's slot among them times topk plus its top-k position (p % K).
 * 0, or -1 when the block does not have exactly distinct tokens. */
int64_t rmoe_kernel_dedup_map(int64_t topk, int64_t first, int64_t count, const int32_t *pair_order, int64_t distinct,
                              int32_t *tokens, int32_t *codes);

/* ---- rows of a slice of the pair order ------------------------------------------- */

/* -1, or the first i in [0, count) whose pair pair_order[first + i] is not in
 * [0, n_pairs). */
int64_t rmoe_kernel_first_bad_pair(const int32_t *pair_order, int64_t first, int64_t count,
                                   int64_t n_pairs);

/* rows[i] = src[pair_order[first+i] / K] (* topk_w[pair] when topk_w). */
void rmoe_kernel_gather(int64_t hidden, int64_t topk, int64_t first, int64_t count, const float *src,
                        const int32_t *pair_order, const float *topk_w, float *rows);

/* dst[pair_order[first+i] / K] += (topk_w[pair] *) rows[i]. */
void rmoe_kernel_scatter_add(int64_t hidden, int64_t topk, int64_t first, int64_t count, const float *rows,
                             const int32_t *pair_order, const float *topk_w, float *dst);

/* All-to-all combine backward: dout[i] = g dy[t]; dg[p] = <dy[t], back[i]>,
 * p = pair_order[first+i], t = p / K. */
void rmoe_kernel_unpermute_bwd(int64_t hidden, int64_t topk, int64_t first, int64_t count, const float *dy,
                               const float *back, const int32_t *pair_order, const float *topk_w,
                               float *dout, float *dg);

/* ---- experts (grouped over one partition) ---------------------------------------------- */

/* rows_per_expert[e] rows of local expert e, in order, m in all. work [m*3F]
 * (or the [m*4F] workspace of the pair-weighted backward: the first three
 * blocks written); out [m*H], or NULL to stop after act (the §3.3
 * recompute). */
void rmoe_kernel_expert_ffn(int64_t hidden, int64_t ffn, int64_t n_experts, const int64_t *rows_per_expert,
                            int64_t m, const float *x, const float *w, float *work, float *out);

/* Pair-weighted backward (ring, §3.3): dy rows unweighted, routing weights
 * read per pair (pairs pair_order[first..first+m)). x rows are consumed:
 * they end as the rows' dx, which is added into dx [T*H] at each pair's
 * token (dx NULL: not added, the result is the rows' dx in x); dg[p] = <u, act>; dweights overwritten (accumulate = 0; experts
 * without rows zeroed) or added to. work [m*4F] holds the recompute's first
 * three blocks on entry and dpre_gate | dpre_up | g*act | g*u on return. */
void rmoe_kernel_expert_bwd_pairs(int64_t hidden, int64_t ffn, int64_t n_experts,
                                  const int64_t *rows_per_expert, int64_t m, int64_t first, int64_t topk,
                                  int accumulate, float *x, const float *dy, const float *w,
                                  const int32_t *pair_order, const float *topk_w, float *work, float *dx,
                                  float *dg, float *dweights);

/* Preweighted backward (all-to-all, shared expert): dout rows already carry
 * the routing weight. work [m*3F] holds the forward's intermediates on entry
 * and dpre_gate | dpre_up | dact on return; dx rows [m*H] written. */
void rmoe_kernel_expert_bwd_preweighted(int64_t hidden, int64_t ffn, int64_t n_experts,
                                        const int64_t *rows_per_expert, int64_t m, int accumulate,
                                        const float *x, const float *dout, const float *w, float *work,
                                        float *dx, float *dweights);

/* ---- small ops ----------------------------------------------------------------------------- */

/* Element conversions: float32 to bf16 (round to nearest even) and back. */
void rmoe_kernel_to_bf16(int64_t n, const float *src, uint16_t *dst);
void rmoe_kernel_from_bf16(int64_t n, const uint16_t *src, float *dst);

/* dst += src; dst = 0 (n floats). */
void rmoe_kernel_accumulate(int64_t n, const float *src, float *dst);
void rmoe_kernel_zero(int64_t n, float *dst);
/* dst [n_dst] = the first of src [n_src], zeros after them (4-byte
 * elements: floats, int32, or a bf16 buffer's fp32 copy). */
void rmoe_kernel_copy_pad(int64_t n_src, int64_t n_dst, const float *src, float *dst);

/* All-to-all "sort by local expert" and its inverse. Chunk (q, e) holds
 * counts[q*ne + e] rows of local expert e from peer q; peer[q] is peer q's
 * rows (NULL for a peer with no rows). sort: peer chunks -> sorted in
 * (e, q) order; otherwise sorted -> peer chunks. */
void rmoe_kernel_sort_chunks(int64_t hidden, int64_t n_peers, int64_t n_experts, const int64_t *counts,
                             int sort, float *const *peer, float *sorted);

#ifdef __cplusplus
}
#endif

#endif /* RMOE_KERNELS_H */
