/* AdamW with global gradient-norm clipping for `relaymoe train`. The moments
 * follow the model's two arrays: replicated parameters (identical on every
 * rank, so the update is too) and the experts a rank owns. */
#ifndef RMOE_TRAIN_OPTIMIZER_H
#define RMOE_TRAIN_OPTIMIZER_H

#include <stdint.h>

#include "model.h"

struct rmoe_adamw_config {
	double lr;             /* peak learning rate */
	int64_t warmup;        /* steps of linear warm-up to lr; 0 = none */
	double beta1, beta2, eps;
	double weight_decay;   /* decoupled, on matrices only (tensor.decay) */
	double clip;           /* largest global gradient norm; 0 = no clipping */
};

struct rmoe_adamw {
	struct rmoe_adamw_config cfg;
	float *m_rep, *v_rep;  /* [rep_n] */
	float *m_exp, *v_exp;  /* [exp_n] */
	int64_t rep_n, exp_n;
};

/* Defaults: lr 3e-3, warm-up 10, beta1 0.9, beta2 0.95, eps 1e-8, weight
 * decay 0.1, clip 1.0. */
void rmoe_adamw_config_init(struct rmoe_adamw_config *cfg);

/* Zero moments sized for m. 0 or RMOE_ENOMEM. */
int rmoe_adamw_init(struct rmoe_adamw *o, const struct rmoe_adamw_config *cfg,
                    const struct rmoe_train_model *m);
void rmoe_adamw_free(struct rmoe_adamw *o);

/* Collective: the norm of all gradients, replicated ones counted once and
 * experts summed over their owners. The same value on every rank. */
double rmoe_adamw_grad_norm(const struct rmoe_train_model *m);

/* The learning rate of step (1-based). */
double rmoe_adamw_lr(const struct rmoe_adamw_config *cfg, int64_t step);

/* Step (1-based) of AdamW with bias correction, on the gradients multiplied
 * by grad_scale (the clipping factor). */
void rmoe_adamw_update(struct rmoe_adamw *o, struct rmoe_train_model *m, int64_t step, double lr,
                       double grad_scale);

#endif
