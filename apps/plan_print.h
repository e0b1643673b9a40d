/* relaymoe plan's output: the plan made (cmd_plan.c) written as text or as
 * JSON, whole, into a text that rank 0 prints. */
#ifndef RMOE_PLAN_PRINT_H
#define RMOE_PLAN_PRINT_H

#include <stdint.h>

#include "relaymoe/relaymoe.h"
#include "rmoe_attn_plan.h"
#include "rmoe_plan.h"
#include "text.h"

/* Selective attention recomputation (§3.4), once per dispatcher: the memory
 * each MoE block needs decides how much attention the device can keep. SP
 * shards the sequence over the tensor-parallel ranks, so TP = SP here. */
struct rmoe_plan_attention {
	struct rmoe_attn_plan_input in, per[2];
	struct rmoe_attn_plan plan[2];   /* ring expert routing, all-to-all */
	int rc[2];
	int64_t model_state;
	int estimated_state;             /* model_state estimated, not given (--model-state) */
};

/* What relaymoe plan prints: the plan, and what it was asked. */
struct rmoe_plan_view {
	const char *preset;              /* --preset; NULL: none */
	double scale;                    /* --scale */
	const char *cluster_file;        /* --cluster; NULL: the built-in assumptions */
	int rank_order;                  /* --ring-order rank */
	int64_t mem_cap, budget;         /* --mem-cap, --budget; 0: not given */
	int live;                        /* the topology is the ranks' own (under mpirun) */
	const struct rmoe_layer_config *cfg; /* the layer: its routing */
	const struct rmoe_routing_problem *p;
	const struct rmoe_topology *t;
	const struct rmoe_plan *plan;
	const struct rmoe_plan_attention *attention; /* --attention; NULL: not asked */
};

void rmoe_plan_print_text(struct rmoe_text *o, const struct rmoe_plan_view *v);
void rmoe_plan_print_json(struct rmoe_text *o, const struct rmoe_plan_view *v);

#endif
