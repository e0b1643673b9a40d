/* The analytical memory model: the peak bytes one rank's layer holds, per
 * dispatcher, from the configuration, built from the buffers the graphs of
 * graph/ create and the order in which they live (one hop's or chunk's
 * intermediates at a time for the rings; the stages of the all-to-all).
 * Pure functions; bench/ checks them against measurement. */
#ifndef RMOE_MEMORY_MODEL_H
#define RMOE_MEMORY_MODEL_H

#include <stdint.h>

#include "relaymoe/relaymoe.h"

/* The runtime's structures a pass's graph holds beside its data, bytes of
 * one in this StarPU (codelets/probe/bookkeeping.c measures them where a
 * context starts): a handle, a task, each data a task names, a StarPU-MPI
 * send and receive. Zeros:
 * not counted (a plan made without a context). */
struct rmoe_runtime_units {
	int64_t handle, task, task_buffer, send, recv;
};

struct rmoe_mem_config {
	int64_t tokens;        /* local tokens per rank, B*S/(SP*CP) */
	int64_t hidden, ffn, experts, topk;
	int64_t nranks;        /* expert-parallel group */
	int64_t shared_ffn;
	int shared_gated;      /* Qwen2-MoE's gate on the shared expert (backward: one more [T,H]) */
	int64_t etp;           /* expert tensor parallelism: divides F (1: none) */
	int64_t chunk_rows;    /* 0: whole hops */
	int stripes;           /* the rings: the most stripes a
	                          node-crossing hop goes in (scheduler/stripes.c);
	                          0 or 1: none */
	int64_t partitions;    /* ring: partitions of each rank's experts (hops on one device); 0 or 1: one */
	int64_t window;        /* ring: receive buffers per relayed kind; 0: RMOE_WINDOW_DEFAULT;
	                          all-to-alls: blocks in flight per role; 0: rmoe_a2a_depth's */
	int capped;            /* planned under a memory cap (rmoe_a2a_depth) */
	int dtype_bytes;       /* 4 (fp32) or 2 (bf16): activations and weights */
	double skew;           /* rows of the busiest partition over the even share
	                          (1: even routing; at most nranks * partitions) */
	const int64_t *blocks; /* a2a, the routing seen: the rows rank s routes to
	                          rank q at [s * nranks + q]; NULL: the skew's bound */
	const int64_t *block_tokens; /* a2a-deepep with blocks: the distinct tokens
	                          of each block, same layout; NULL: those a uniform
	                          router gives */
	struct rmoe_runtime_units runtime; /* the structures' bytes (zeros: not
	                          counted): the estimate's runtime_* and the cap */
	int64_t capacity;      /* tokens the layer's kept [T, *] buffers have room
	                          for (rmoe_layer_config.tokens); 0: tokens */
	const int64_t *rank_tokens; /* [nranks] each rank's tokens in the call
	                          (rmoe_layer_set_tokens); NULL: every rank tokens.
	                          The estimate is then the most any rank holds,
	                          each rank with its own tokens, skew and blocks
	                          as above (token routing carries every partition
	                          at the largest count) */
};

/* Defaults: one rank, fp32, even routing, no ETP, no chunking. */
void rmoe_mem_config_init(struct rmoe_mem_config *c);

struct rmoe_mem_estimate {
	int64_t resident_forward;   /* weights, gradients, saved input and routing,
	                               the caller's y */
	int64_t resident_backward;  /* the same with dy and dx instead of y */
	int64_t weights_and_inputs; /* weights plus the caller's x, dy: what a step
	                               finds in memory before it starts */
	int64_t dynamic_forward;    /* temporaries' peak (StarPU-allocated) */
	int64_t dynamic_backward;
	int64_t peak_forward;       /* resident + dynamic */
	int64_t peak_backward;
	int64_t peak;               /* max of the two */
	int64_t largest_buffer;
	int64_t fixed_backward;     /* backward peak without the rows of a hop */
	int64_t per_row_backward;   /* bytes each row of a hop (or chunk) adds */
	int64_t leaving_forward;    /* a2a: of the dynamic peak, the rows still to
	                               leave for their experts (the token blocks'
	                               inputs), which the network may have taken
	                               before the peak: the peak lies between
	                               dynamic - leaving and dynamic; 0 elsewhere */
	int64_t leaving_backward;
	int64_t runtime_forward;    /* the runtime's structures the pass's graph
	                               holds (c->runtime's units): per chunk of
	                               a hop or block and per hop, the handles,
	                               tasks and requests the dispatcher's graph
	                               makes (its row's runtime_*); 0 without
	                               units. The heap holds them beside the
	                               data: a cap holds peak + runtime */
	int64_t runtime_backward;
};

/* a2a-deepep's blocks under a uniform router (K of E experts, el of them
 * on the block's rank): the distinct tokens a block holds per pair; and a
 * block's distinct tokens d brought within what its pairs allow (at least
 * pairs / min(K, el), at most pairs and the rank's tokens). The model and
 * the simulation's peer counts (graph/pass/sim_routing.c) both use them. */
double rmoe_uniform_tokens_per_pair(int64_t topk, int64_t experts, int64_t el);
int64_t rmoe_block_tokens_within(int64_t d, int64_t pairs, int64_t tokens, int64_t topk, int64_t el);

/* The model's view of a layer configuration on nranks ranks (skew 1). */
void rmoe_mem_config_from_layer(struct rmoe_mem_config *c, const struct rmoe_layer_config *cfg,
                                int nranks);

/* 0, or RMOE_EINVAL naming a bad value. */
int rmoe_memory_model(enum rmoe_dispatch d, const struct rmoe_mem_config *c,
                      struct rmoe_mem_estimate *out);

/* Memory cap (ring dispatch and a2a): the largest chunk (rows per chunk of a hop)
 * whose modelled peak, with the runtime's structures of its chunks, stays
 * within cap bytes less 1/RMOE_CAP_HEADROOM of them (memory_model.c says
 * why). Smaller chunks hold fewer rows but more structures: 0, or
 * RMOE_EINVAL when no chunk fits, naming what the layer needs at least. */
#define RMOE_CAP_HEADROOM 32
int rmoe_memory_cap_chunk(enum rmoe_dispatch d, const struct rmoe_mem_config *c, int64_t cap,
                          int64_t *chunk_rows);

/* The all-to-alls (a2a, a2a-deepep) pipeline their exchanges block by
 * block (or chunk by chunk): each rank has at most this many in flight as
 * a sender of its tokens (rows out, results back) and as many as the owner
 * of experts (rows in, computed, results out). window > 0 sets it. By
 * default every peer's: a sender's next block waits for the results of the
 * one that many before, a round trip over the network and the peer's
 * experts, and fewer in flight leave the network adapters idle while it
 * lasts (two took 1.84x the simulated bound at full size, EP 8; every
 * peer's 1.17x: docs/results.md). Under a memory cap the lean
 * RMOE_A2A_LEAN_DEPTH, the cap then chunking the blocks. */
#define RMOE_A2A_LEAN_DEPTH 2
static inline int64_t rmoe_a2a_depth(int64_t window, int64_t nranks, int capped)
{
	if (window > 0)
		return window;
	return capped || nranks < RMOE_A2A_LEAN_DEPTH ? RMOE_A2A_LEAN_DEPTH : nranks;
}

/* Largest local token count whose peak fits budget bytes (0 if none). */
int64_t rmoe_memory_max_tokens(enum rmoe_dispatch d, const struct rmoe_mem_config *c, int64_t budget);

#endif
