/* AdamW (decoupled weight decay) with bias correction and global-norm
 * clipping. Every element is updated in double from float state, in a fixed
 * order, so runs repeat bit for bit. */
#include <math.h>
#include <mpi.h>
#include <stdlib.h>

#include "optimizer.h"
#include "relaymoe/relaymoe.h"

void rmoe_adamw_config_init(struct rmoe_adamw_config *cfg)
{
	cfg->lr = 3e-3;
	cfg->warmup = 10;
	cfg->beta1 = 0.9;
	cfg->beta2 = 0.95;
	cfg->eps = 1e-8;
	cfg->weight_decay = 0.1;
	cfg->clip = 1.0;
}

int rmoe_adamw_init(struct rmoe_adamw *o, const struct rmoe_adamw_config *cfg,
                    const struct rmoe_train_model *m)
{
	o->cfg = *cfg;
	o->rep_n = m->rep_n;
	o->exp_n = m->exp_n;
	o->m_rep = calloc((size_t)(m->rep_n > 0 ? m->rep_n : 1), sizeof(float));
	o->v_rep = calloc((size_t)(m->rep_n > 0 ? m->rep_n : 1), sizeof(float));
	o->m_exp = calloc((size_t)(m->exp_n > 0 ? m->exp_n : 1), sizeof(float));
	o->v_exp = calloc((size_t)(m->exp_n > 0 ? m->exp_n : 1), sizeof(float));
	if (!o->m_rep || !o->v_rep || !o->m_exp || !o->v_exp) {
		rmoe_adamw_free(o);
		return RMOE_ENOMEM;
	}
	return 0;
}

void rmoe_adamw_free(struct rmoe_adamw *o)
{
	free(o->m_rep);
	free(o->v_rep);
	free(o->m_exp);
	free(o->v_exp);
	o->m_rep = o->v_rep = o->m_exp = o->v_exp = NULL;
}

static double sum_squares(const float *g, int64_t n)
{
	double s = 0.0;
	for (int64_t i = 0; i < n; i++)
		s += (double)g[i] * g[i];
	return s;
}

double rmoe_adamw_grad_norm(const struct rmoe_train_model *m)
{
	/* Replicated gradients are already summed over ranks and identical
	 * everywhere: counted once. Expert gradients are disjoint: summed. */
	double experts = sum_squares(m->exp_g, m->exp_n);
	MPI_Allreduce(MPI_IN_PLACE, &experts, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	return sqrt(sum_squares(m->rep_g, m->rep_n) + experts);
}

double rmoe_adamw_lr(const struct rmoe_adamw_config *cfg, int64_t step)
{
	if (cfg->warmup > 0 && step < cfg->warmup)
		return cfg->lr * (double)step / (double)cfg->warmup;
	return cfg->lr;
}

static void update(const struct rmoe_adamw_config *c, float *w, const float *g, float *mo, float *ve,
                   int64_t n, int decay, double lr, double scale, double bc1, double bc2)
{
	const double b1 = c->beta1, b2 = c->beta2, wd = decay ? c->weight_decay : 0.0;
	for (int64_t i = 0; i < n; i++) {
		double gi = (double)g[i] * scale;
		double mi = b1 * mo[i] + (1.0 - b1) * gi;
		double vi = b2 * ve[i] + (1.0 - b2) * gi * gi;
		mo[i] = (float)mi;
		ve[i] = (float)vi;
		double step = (mi / bc1) / (sqrt(vi / bc2) + c->eps);
		w[i] = (float)((double)w[i] - lr * (step + wd * (double)w[i]));
	}
}

void rmoe_adamw_update(struct rmoe_adamw *o, struct rmoe_train_model *m, int64_t step, double lr,
                       double grad_scale)
{
	const double bc1 = 1.0 - pow(o->cfg.beta1, (double)step);
	const double bc2 = 1.0 - pow(o->cfg.beta2, (double)step);
	for (int i = 0; i < m->ntensors; i++) {
		const struct rmoe_train_tensor *t = &m->tensors[i];
		if (t->replicated)
			update(&o->cfg, m->rep_w + t->offset, m->rep_g + t->offset, o->m_rep + t->offset,
			       o->v_rep + t->offset, t->count, t->decay, lr, grad_scale, bc1, bc2);
		else
			update(&o->cfg, m->exp_w + t->offset, m->exp_g + t->offset, o->m_exp + t->offset,
			       o->v_exp + t->offset, t->count, t->decay, lr, grad_scale, bc1, bc2);
	}
}
