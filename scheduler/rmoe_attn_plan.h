/* Selective attention recomputation (paper §3.4): with full activation
 * recomputation every attention layer keeps only its input and recomputes
 * the rest during backward. The memory the MoE dispatcher leaves free
 * (device capacity minus the peak under full recomputation) can keep some
 * attention activations instead. For each attention layer i and each option
 * j (what to keep) the planner estimates the bytes kept, m_ij, and the
 * recomputation FLOPs avoided, c_ij, ranks the options by c_ij / m_ij and
 * takes them greedily within the budget. Pure functions: no StarPU, no MPI.
 *
 * Options, cumulative per layer (GQA with FlashAttention; the local sizes
 * follow TP over heads, CP over the sequence, SP over the norm regions):
 *   KEEP_CORE  the core-attention output O [b, s/CP, h/TP, d] and its softmax
 *              statistics (logsumexp, fp32): backward skips the attention
 *              kernel's forward, the O(s^2) part, but still recomputes Q, K, V;
 *   KEEP_QKV   also Q, K, V after RoPE: backward skips the QKV projection too;
 *   KEEP_ALL   also the normalised input of the QKV projection (sharded under
 *              SP): nothing of the layer is recomputed.
 * An option of a layer is available once the one before it is taken; an
 * option that does not fit ends that layer's upgrades. */
#ifndef RMOE_ATTN_PLAN_H
#define RMOE_ATTN_PLAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum rmoe_attn_keep {
	RMOE_ATTN_RECOMPUTE = 0,  /* keep the layer input only (full recomputation) */
	RMOE_ATTN_KEEP_CORE = 1,
	RMOE_ATTN_KEEP_QKV = 2,
	RMOE_ATTN_KEEP_ALL = 3,
};
#define RMOE_ATTN_NKEEP 4
#define RMOE_ATTN_MAX_LAYERS 1024

struct rmoe_attn_plan_input {
	/* model: the attention layers on this device */
	int64_t layers;
	int64_t heads, kv_heads, head_dim, hidden;
	const int64_t *window;       /* per layer: sliding window in tokens, 0 = full causal;
	                                NULL: every layer full causal */
	/* work */
	int64_t seq_len;             /* S, the whole sequence */
	int64_t micro_batch;         /* b */
	/* parallelism */
	int64_t tp, cp, ep;
	int sp;                      /* sequence parallelism: norm regions sharded over TP */
	int dtype_bytes;             /* activations: 2 (bf16) or 4 */
	/* memory of one device */
	int64_t device_bytes;
	int64_t model_state_bytes;   /* parameters, gradients, optimizer state */
	int64_t moe_peak_bytes;      /* transient peak of one MoE block with the chosen dispatcher */
	int64_t other_activation_bytes; /* kept through the step besides the attention
	                                   layers' inputs (e.g. the MoE blocks' saved inputs
	                                   and routing) */
	/* optional, for the throughput estimate: one MoE block per layer (0: none) */
	int64_t moe_ffn, moe_topk, moe_shared_ffn;
};

/* What each option of one layer keeps and saves, cumulative by level. */
struct rmoe_attn_layer_cost {
	int64_t bytes[RMOE_ATTN_NKEEP];
	double flops_saved[RMOE_ATTN_NKEEP];
	double forward_flops;        /* the layer's attention forward (norm, QKV, core, output) */
	double step_flops;           /* forward + backward + full recomputation */
};

struct rmoe_attn_plan {
	int64_t local_tokens;        /* query tokens per device: S / CP */
	int64_t local_heads, local_kv_heads;
	int64_t checkpoint_bytes;    /* every layer's input, kept under full recomputation */
	int64_t recompute_transient_bytes; /* one layer rebuilt in backward, with its gradients */
	int64_t peak_full_bytes;     /* model states + checkpoints + other activations
	                                + max(MoE peak, attention recompute transient) */
	int64_t budget_bytes;        /* device - peak_full (negative: does not fit) */
	int64_t used_bytes;          /* kept by the chosen options */
	int64_t peak_plan_bytes;     /* peak_full + used */
	int fits;                    /* peak_full <= device */
	int64_t layers;
	unsigned char keep[RMOE_ATTN_MAX_LAYERS]; /* chosen enum rmoe_attn_keep per layer */
	int64_t retained_layers;     /* keep > RECOMPUTE: fully or partially retained */
	int64_t full_layers;         /* KEEP_ALL: nothing recomputed */
	int64_t at_level[RMOE_ATTN_NKEEP];
	int64_t options_taken, options_refused;
	double step_flops_full;      /* per device per micro-batch, full recomputation */
	double flops_saved;
	double predicted_gain;       /* step_flops_full / (step_flops_full - flops_saved) */
};

/* Checks in, then the costs of layer (0 <= layer < layers). 0 or RMOE_EINVAL. */
int rmoe_attn_layer_cost(const struct rmoe_attn_plan_input *in, int64_t layer,
                         struct rmoe_attn_layer_cost *cost);

/* The greedy selection. 0, or RMOE_EINVAL naming the bad value (message via
 * rmoe_strerror). A configuration whose full-recomputation peak exceeds the
 * device is not an error: plan->fits = 0 and nothing is retained. */
int rmoe_attn_plan(const struct rmoe_attn_plan_input *in, struct rmoe_attn_plan *plan);

/* A readable table of the options and the choice, headed by label (e.g. the
 * dispatcher's name). Returns the length it needed (as snprintf). */
int rmoe_attn_plan_format(const struct rmoe_attn_plan_input *in, const struct rmoe_attn_plan *plan,
                          const char *label, char *buf, size_t len);

/* The same as one JSON object. Returns the length it needed. */
int rmoe_attn_plan_json(const struct rmoe_attn_plan_input *in, const struct rmoe_attn_plan *plan,
                        const char *label, char *buf, size_t len);

/* Name of a level: "recompute", "keep-core", "keep-qkv", "keep-all". */
const char *rmoe_attn_keep_name(int level);

#ifdef __cplusplus
}
#endif

#endif
