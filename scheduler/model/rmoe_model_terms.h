/* The terms the dispatchers' memory models are written in (memory_model.c
 * names them, its head comment says what each buffer is), and the models
 * themselves, one per dispatcher (ring.c, alltoall.c), which the rows of
 * dispatchers.c name. */
#ifndef RMOE_MODEL_TERMS_H
#define RMOE_MODEL_TERMS_H

#include <stdint.h>

#include "rmoe_dispatchers.h"
#include "rmoe_error.h"
#include "rmoe_memory_model.h"

struct rmoe_model_terms {
	const struct rmoe_mem_config *c;
	int64_t T, H, F, E, K, N, s, Fs, P;   /* T: this rank's tokens, P its pairs */
	int64_t Tm;     /* the call's largest count, any rank's */
	int64_t Tc;     /* the capacity the kept buffers have room for */
	int64_t W;      /* elements of one partition's weights */
	int64_t even;   /* a rank's pairs at even routing */
	int64_t r;      /* rows of the busiest hop or block, or the chunk rows */
	int64_t rm;     /* the same for a partition of the largest count (a
	                   visiting one of token routing) */
	int64_t M;      /* rows the busiest rank's experts compute (a2a-megatron) */
	int64_t window; /* ring slots per relayed kind */
	int64_t shared, shared_b; /* the shared expert's phase, forward and backward */
};

/* A dispatcher's dynamic peaks and largest buffer (the latter starts at the
 * shared expert's and the caller's buffers). */
struct rmoe_model_phase {
	int64_t fwd, bwd, largest;
};

static inline int64_t rmoe_max2(int64_t a, int64_t b)
{
	return a > b ? a : b;
}

/* A model's end: its phase into p; 0. */
static inline int rmoe_model_done(struct rmoe_model_phase *p, int64_t fwd, int64_t bwd, int64_t largest)
{
	p->fwd = fwd;
	p->bwd = bwd;
	p->largest = largest;
	return 0;
}

/* The end of a model whose buffers are built whole: no row of a hop to
 * shed, so a memory cap finds all of its backward fixed. */
static inline int rmoe_model_whole(struct rmoe_model_phase *p, struct rmoe_mem_estimate *o, int64_t fwd,
                                   int64_t bwd, int64_t largest)
{
	o->fixed_backward = o->resident_backward + bwd;
	o->per_row_backward = 0;
	return rmoe_model_done(p, fwd, bwd, largest);
}

int rmoe_model_ring_expert(const struct rmoe_model_terms *t, struct rmoe_model_phase *p, struct rmoe_mem_estimate *o);
int rmoe_model_ring_token(const struct rmoe_model_terms *t, struct rmoe_model_phase *p, struct rmoe_mem_estimate *o);
int rmoe_model_alltoall(const struct rmoe_model_terms *t, struct rmoe_model_phase *p, struct rmoe_mem_estimate *o);
int rmoe_model_alltoall_megatron(const struct rmoe_model_terms *t, struct rmoe_model_phase *p,
                                 struct rmoe_mem_estimate *o);
int rmoe_model_alltoall_deepep(const struct rmoe_model_terms *t, struct rmoe_model_phase *p,
                               struct rmoe_mem_estimate *o);

#endif
