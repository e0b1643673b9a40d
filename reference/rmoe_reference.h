/* A plain single-process implementation of the MoE layer's definition
 * (docs/running.md, "The layer"), in double-precision loops with no BLAS and
 * no StarPU: the independent reference the tests and `relaymoe run --check`
 * compare with.
 * All tokens of all ranks at once: T_total = N*T rows.
 */
#ifndef RMOE_REFERENCE_H
#define RMOE_REFERENCE_H

#include <stdint.h>

struct rmoe_ref_layer {
	int64_t hidden, ffn, experts, topk;
	int norm_topk;
	int64_t shared_ffn;            /* 0 = no shared expert */
	const float *w_router;         /* [H, E] */
	const float *w_gate, *w_up;    /* [E, H, F] */
	const float *w_down;           /* [E, F, H] */
	const float *ws_gate, *ws_up;  /* [H, Fs] shared expert, when shared_ffn > 0 */
	const float *ws_down;          /* [Fs, H] */
	int shared_gated;              /* Qwen2-MoE: shared(x) scaled by sigmoid(x w_shared_expert_gate) */
	const float *w_shared_expert_gate; /* [H], when shared_gated */
};

struct rmoe_ref_grads {
	float *dx;                     /* [T, H] */
	float *dw_router;              /* [H, E] */
	float *dw_gate, *dw_up;        /* [E, H, F] */
	float *dw_down;                /* [E, F, H] */
	float *dws_gate, *dws_up, *dws_down; /* shared expert, may be NULL when none */
	float *dw_shared_expert_gate;  /* [H], when shared_gated (may be NULL) */
};

/* Routing of T tokens: probs [T, E] (softmax, double inside), topk_idx
 * [T, K] in descending probability (ties: lower expert first), topk_w [T, K]
 * (renormalised when norm_topk).
 * hint (may be NULL): another implementation's choice [T, K]. Where it selects
 * a different set of experts for a token, the hint is used if, and only if,
 * every expert it selects has a probability within tie_tol (absolute) of the
 * K-th largest: a float32 near-tie, not a wrong choice. Returns the number of
 * tokens where the hint was taken that way, or -1 if a hint was wrong (the
 * routing then follows the reference). */
int64_t rmoe_ref_route(const struct rmoe_ref_layer *L, int64_t tokens, const float *x,
                       float *probs, int32_t *topk_idx, float *topk_w,
                       const int32_t *hint, double tie_tol);

/* y [T, H] from x and the routing above (topk_idx, topk_w). */
void rmoe_ref_forward(const struct rmoe_ref_layer *L, int64_t tokens, const float *x,
                      const int32_t *topk_idx, const float *topk_w, float *y);

/* All gradients from dy, for the routing above (probs needed for the router). */
void rmoe_ref_backward(const struct rmoe_ref_layer *L, int64_t tokens, const float *x,
                       const float *probs, const int32_t *topk_idx, const float *topk_w,
                       const float *dy, struct rmoe_ref_grads *g);

/* ||a - b|| / max(||b||, tiny), in double. */
double rmoe_ref_rel_err(const float *a, const float *b, int64_t n);

#endif
