/* The language model of `relaymoe train`, built on rmoe_layer:
 *
 *   h_0 = emb[token]                                  emb   [V, H]
 *   h_{l+1} = h_l + moe_l(rmsnorm(h_l) * g_l)          L blocks, g_l [H]
 *   logits = (rmsnorm(h_L) * g_f) head                 g_f [H], head [H, V]
 *   loss = mean over all ranks' tokens of -log softmax(logits)[next token]
 *
 * moe_l is an rmoe_layer (router, top-k, SwiGLU experts, optional shared
 * expert). Replicated parameters (embedding, norms, routers, shared
 * experts, head) live in one flat array, so their gradients are summed over
 * ranks with one MPI_Allreduce; the routed experts a rank owns live in
 * another and their gradients stay with the owner. The auxiliary loss is the
 * Switch-style load-balancing term alpha * E * sum_e f_e * P_e per layer,
 * with f_e the fraction of routed (token, expert) pairs on e and P_e the
 * mean router probability of e over all ranks' tokens. */
#ifndef RMOE_TRAIN_MODEL_H
#define RMOE_TRAIN_MODEL_H

#include <stdint.h>

#include "relaymoe/relaymoe.h"

struct rmoe_train_shape {
	int64_t layers, hidden, ffn, experts, topk, vocab, tokens, shared_ffn;
};

/* One parameter tensor: a view into the replicated or the expert array. */
struct rmoe_train_tensor {
	char name[40];
	int64_t offset, count;   /* in rep_* (replicated) or exp_* (experts) */
	int replicated;
	int decay;               /* AdamW weight decay applies: matrices only */
};

/* What one step measured on this rank. */
struct rmoe_train_result {
	double loss;             /* cross-entropy, mean over all ranks' tokens */
	double aux;              /* load-balancing loss, summed over layers */
	int64_t peak_layer_bytes;/* largest rmoe_layer_get_stats peak of any layer */
	int64_t peak_rss_bytes;
};

struct rmoe_train_model {
	struct rmoe_train_shape shape;
	int rank, nranks;
	int64_t first_expert, e_local;
	double aux_weight;
	float *rep_w, *rep_g;
	int64_t rep_n;
	float *exp_w, *exp_g;
	int64_t exp_n;
	struct rmoe_train_tensor *tensors;
	int ntensors;
	/* offsets into rep_w (and rep_g) */
	int64_t off_emb, off_norm_f, off_head;
	int64_t *off_norm, *off_router, *off_shared; /* per layer; shared: gate | up | down */
	int64_t *off_experts;    /* per layer, into exp_w: e_local x (gate | up | down) */
	rmoe_layer **moe;
	/* activations of the last step */
	float *h;                /* [L+1][T, H] residual stream */
	float *u;                /* [L+1][T, H] normalised inputs of the layers and of the head */
	double *rinv;            /* [L+1][T] 1 / rms */
	float *logits;           /* [T, V], then its gradient */
	float *y, *dh, *du;      /* [T, H]: a layer's output; gradients of h and u */
	float *probs, *dprobs;   /* [T, E] */
	int32_t *topk_idx;       /* [T, K] */
	double *route;           /* [L][2E]: pair counts and probability sums, over all ranks */
	const int32_t *seq;      /* the step's tokens (T + 1) */
};

/* Collective. Creates the L layers on ctx (dispatch d, deterministic
 * accumulation), draws every parameter from seed (rank-count independent:
 * expert e's weights are the same whichever rank owns it) and hands them to
 * the layers. 0 or an RMOE_E* code, message printed on every rank. */
int rmoe_train_model_init(struct rmoe_train_model *m, rmoe_ctx *ctx, const struct rmoe_train_shape *s,
                          enum rmoe_dispatch d, double aux_weight, uint64_t seed);
void rmoe_train_model_free(struct rmoe_train_model *m);

/* Collective: copies the parameters into the layers (after an update or a
 * resume). */
int rmoe_train_model_push(struct rmoe_train_model *m);

/* Collective: forward and backward on this rank's tokens seq[0..T) with
 * targets seq[1..T]; leaves the replicated gradients summed over ranks in
 * rep_g and the owned experts' gradients in exp_g. */
int rmoe_train_model_step(struct rmoe_train_model *m, const int32_t *seq, struct rmoe_train_result *r);

/* Collective: 1 when every rank holds bit-identical replicated parameters. */
int rmoe_train_model_replicas_agree(const struct rmoe_train_model *m);

#endif
