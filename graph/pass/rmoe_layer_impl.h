/* The layer behind the public rmoe_layer: its configuration and plan, the
 * buffers it keeps across calls and their StarPU handles. Private to
 * graph/. */
#ifndef RMOE_LAYER_IMPL_H
#define RMOE_LAYER_IMPL_H

#include <starpu.h>
#include <stdint.h>

#include "relaymoe/relaymoe.h"
#include "rmoe_codelets.h"
#include "rmoe_ctx.h"
#include "rmoe_dispatchers.h"

struct rmoe_wait; /* rmoe_collective.h */

/* The routing of one token partition as the graphs use it: the pair order
 * (pairs sorted by expert), the routing weights, the dg accumulator, and the
 * per-expert offsets into the pair order (host, E+1 entries). A layer's own
 * tokens have one; with token routing, visiting partitions have theirs. */
struct rmoe_routing {
	starpu_data_handle_t pair_order, topk_w, dg;
	const int64_t *offsets;
};

struct rmoe_a2a_plan;
struct rmoe_dispatch_ops; /* rmoe_dispatch.h */

struct rmoe_layer {
	rmoe_ctx *ctx;
	struct rmoe_layer_config cfg;     /* as planned: the dispatch that runs, the chunk rows */
	enum rmoe_dispatch dispatch;
	/* The dispatch's rows: its traits (scheduler/dispatchers.c) and its
	 * graph (dispatch/table.c). */
	const struct rmoe_dispatcher *traits;
	const struct rmoe_dispatch_ops *ops;
	int64_t H, F, E, K, T, Fs;   /* T: this rank's tokens in the last (or current) forward */
	int64_t cap;              /* tokens the kept [T, *] buffers have room for */
	int64_t next_T;           /* the count the next forward takes (rmoe_layer_set_tokens) */
	int64_t *rank_tokens;     /* [N] every rank's T in the last forward */
	int64_t T_max;            /* the largest of them */
	int N;                    /* ranks in the expert-parallel group */
	int64_t e_local;          /* experts per partition (E / N) */
	int64_t first_expert;     /* of the partition this rank owns */
	int64_t part_floats;      /* elements of one partition's weights */
	size_t act;               /* bytes of an activation or weight element: 4 (f32), 2 (bf16) */

	/* Ring order from the plan: ring[i] is the rank at position i; the
	 * partition a rank owns carries that rank's number. */
	int *ring;
	int ring_pos, left, right;
	/* Each ring edge's stripes (scheduler/stripes.c, from the plan):
	 * stripe_count[N], stripes[N * RMOE_STRIPES_MAX]; striped: some edge
	 * has more than one (graph/pass/stripes.c). */
	int *stripe_count;
	struct rmoe_stripe *stripes;
	int striped;
	int window;               /* the ring's slots per relayed kind (flow.c) */
	int flow_credits;         /* 0: RMOE_FLOW_CREDITS=off, slots without credits (layer.c) */

	/* Host memory the layer owns across calls. */
	float *w_router, *dw_router;
	/* In the layer's element type (act): */
	void *w_part, *dw_part;           /* owned partition: weights and gradient */
	void *ws, *dws;                   /* shared expert: gate | up | down */
	float *w_sgate, *dw_sgate;        /* its gate [H] when shared_gated (Qwen2-MoE) */
	void *x_saved;                    /* §3.3: forward saves x and the routing only */
	float *probs, *topk_w, *dg;
	int32_t *topk_idx, *pair_order, *expert_counts;
	int64_t *expert_offsets;          /* E+1 prefix sums of expert_counts */
	/* A dispatcher that counts each peer's tokens (traits->peer_counts,
	 * a2a-deepep): the expert counts and then, per rank, the tokens routed
	 * to it ([E + N], codelet_dedup.c), what its counts exchange carries. */
	int32_t *peer_counts;
	/* 0, 1, ...: the all-to-alls' pair order of rows that are their own
	 * pairs (alltoall_plan.c), grown to the largest row count seen, kept
	 * to the end. */
	int32_t *iota;
	int64_t iota_n;
	/* The all-to-alls' plan, built by the forward from every rank's expert
	 * counts and kept for the backward (alltoall_plan.c). */
	struct rmoe_a2a_plan *a2a;

	/* Their handles (home node: main memory), registered once. */
	starpu_data_handle_t h_w_router, h_dw_router, h_w_part, h_dw_part, h_ws, h_dws, h_w_sgate, h_dw_sgate;
	starpu_data_handle_t h_x, h_probs, h_topk_idx, h_topk_w, h_dg, h_pair_order, h_counts,
	                    h_peer_counts;
	struct rmoe_routing own;          /* this rank's tokens: the handles above */
	int64_t resident_bytes;

	/* Where the tasks of the pass under way report failure (one pass at a
	 * time per layer): reset as a pass begins, read as it ends. */
	struct rmoe_task_status *tasks;

	int have_forward;
	int have_shared_weights;
	int have_shared_gate;
	char dispatch_reason[384];        /* why this dispatch (RMOE_DISPATCH_AUTO) */
	struct rmoe_layer_stats stats;
};

/* Buffers the layer keeps (layer.c): allocated and freed here. */
void *rmoe_layer_alloc(int64_t n, size_t elsize);
void rmoe_layer_free_buffer(void *p, int64_t n, size_t elsize);

/* The kept [T, *] buffers registered for T tokens, reallocated first when
 * cap exceeds the room they have (layer.c); 0 or RMOE_ENOMEM. */
int rmoe_layer_resize(struct rmoe_layer *L, int64_t T, int64_t cap);

/* Copy between host memory and a registered buffer, waiting for the tasks
 * and transfers that use it (layer_io.c). */
int rmoe_copy_handle(starpu_data_handle_t h, void *dst, const void *src, size_t bytes, int write);
/* An application's float32 array of n values into a registered buffer of
 * elements of elsize bytes (bf16 converted at the edge). */
int rmoe_write_elements(starpu_data_handle_t h, void *buf, const float *src, int64_t n, size_t elsize);

/* This rank's part of the finite check (layer_io.c): the given inputs, then
 * (weights) the router, the owned experts and the shared expert. */
int rmoe_layer_find_nonfinite(struct rmoe_layer *L, struct rmoe_wait *w, const float *x,
                              const float *dy, const float *dprobs,
                              int weights);

#endif /* RMOE_LAYER_IMPL_H */
