/* The layer problem of the programs and the multi-rank tests: a layer
 * configuration and, on each rank, the tensors it is given (its tokens,
 * its output gradient, the replicated router and shared expert, its own
 * experts), drawn from a seed or read from .npy files; and what its
 * routing asks of the memory model. */
#ifndef RMOE_PROBLEM_H
#define RMOE_PROBLEM_H

#include <stdint.h>

#include "relaymoe/relaymoe.h"

/* A layer configuration of this shape, every other field at its default. */
static inline void rmoe_app_layer_shape(struct rmoe_layer_config *cfg, int64_t hidden, int64_t ffn, int64_t experts,
                                        int64_t topk, int64_t tokens)
{
	rmoe_layer_config_init(cfg);
	cfg->hidden = hidden;
	cfg->ffn = ffn;
	cfg->experts = experts;
	cfg->topk = topk;
	cfg->tokens = tokens;
}

/* The tensors of one layer problem on this rank: its tokens, its output
 * gradient, the replicated router (and shared expert) and its own experts.
 * Ranks may hold different token counts: cfg.tokens is the layer's
 * capacity, tokens this rank's count T; the tensors split by tokens (x, dy,
 * and the outputs) are, over the ranks, one global [total_tokens, H] tensor
 * of which this rank holds rows [token0, token0 + T). */
struct rmoe_problem {
	struct rmoe_layer_config cfg;
	int rank, nranks;
	int64_t first_expert, e_local;
	int64_t tokens;              /* T, this rank's */
	int64_t *rank_tokens;        /* [nranks] every rank's T */
	int64_t token0, total_tokens;
	float *x, *dy;               /* [T, H] */
	float *w_router;             /* [H, E] */
	float *w_gate, *w_up;        /* [e_local, H, F] */
	float *w_down;               /* [e_local, F, H] */
	float *ws_gate, *ws_up, *ws_down; /* shared expert, when shared_ffn > 0 */
	float *w_sgate;              /* [H] its gate, when shared_gated (Qwen2-MoE) */
	/* What a check computed for this problem, kept for the next one:
	 * whoever fills it (results.c: the reference) says how to release it;
	 * rmoe_problem_free does. Set at init, so a const problem keeps it. */
	struct rmoe_problem_kept {
		void *data;
		void (*release)(void *data);
	} *kept;
};

/* Room for one tensor of n floats (at least one) of a problem or of its
 * results; NULL when out of memory. Simulated (RMOE_SIMGRID), every rank's
 * copy shares one small area: no kernel reads or writes it there. */
float *rmoe_app_falloc(int64_t n);

/* Draws every tensor from seed, then replaces those with a file in load_dir
 * (may be NULL). Every rank holds cfg->tokens tokens. Collective; 0 or an
 * RMOE_E* code (message printed). */
int rmoe_problem_init(struct rmoe_problem *p, const struct rmoe_layer_config *cfg, uint64_t seed,
                      const char *load_dir);
/* The same with rank r holding rank_tokens[r] >= 0 tokens (every rank
 * passes the same array; NULL: cfg->tokens each). With equal counts the
 * tensors are those of rmoe_problem_init: a rank draws its rows of the
 * same global tensors at any split. */
int rmoe_problem_init_tokens(struct rmoe_problem *p, const struct rmoe_layer_config *cfg,
                             const int64_t *rank_tokens, uint64_t seed, const char *load_dir);
void rmoe_problem_free(struct rmoe_problem *p);
/* Hands p's router, experts and shared expert to layer, and this rank's
 * token count; 0 or the layer's RMOE_E* code. */
int rmoe_problem_apply(const struct rmoe_problem *p, rmoe_layer *layer);

/* Routing skew as the memory model takes it (rmoe_mem_config.skew), from
 * every rank's top-k choices topk_idx [T, K]: the busiest ring hop's pairs
 * over its sending rank's even share (that rank's pairs over the hops;
 * ranks without tokens send none) into *ring, the busiest rank's received
 * pairs over the mean (all-to-all) into *a2a. Collective over
 * MPI_COMM_WORLD. */
void rmoe_problem_routing_skew(const struct rmoe_problem *p, const int32_t *topk_idx, double *ring, double *a2a);
/* The pairs every rank routes to every rank (a2a's blocks, the model's
 * rmoe_mem_config.blocks): [s * nranks + q], from topk_idx (collective);
 * then, at [nranks^2 + s * nranks + q], the distinct tokens of each block
 * (a2a-deepep's, rmoe_mem_config.block_tokens). NULL when out of memory;
 * freed by the caller. */
int64_t *rmoe_problem_a2a_blocks(const struct rmoe_problem *p, const int32_t *topk_idx);

#endif
