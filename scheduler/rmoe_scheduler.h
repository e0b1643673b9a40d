/* scheduler/ holds the decisions taken before a graph is built: the
 * topology (from what the context gathers over MPI and system/ reads of
 * each machine, handed here as plain data), the ring order, the dispatch
 * choice, the memory model, the memory cap's chunking, recompute planning
 * (rmoe_plan.h, rmoe_memory_model.h, rmoe_attn_plan.h); and the
 * configuration's checks and presets. Pure: no StarPU, no MPI, nothing read
 * of the machine (system/ does that) and no call outside itself and base/
 * (errors, hashes), so all of it is unit-testable alone and the same on
 * every rank given the same inputs. */
#ifndef RMOE_SCHEDULER_H
#define RMOE_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>
#include "relaymoe/relaymoe.h"
#include "rmoe_dispatchers.h"
#include "rmoe_error.h"
#include "rmoe_hash.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- parsing ------------------------------------------------------------ */

/* A byte count with an optional K/M/G/T suffix (powers of 1024), "i" and
 * "B" allowed after it: 64G, 512MiB, 68719476736. 0, or -1 (not one, or
 * below 1 byte). */
int rmoe_parse_bytes(const char *s, int64_t *out);

/* ---- configuration ------------------------------------------------------ */

/* The defaults of rmoe_layer_config_init, without what the environment
 * sets there (system/environment.c). */
void rmoe_layer_config_defaults(struct rmoe_layer_config *cfg);

/* Checks every value of cfg for a group of nranks ranks; 0 or RMOE_EINVAL /
 * RMOE_ENOTSUP with a message naming the value and what was expected. */
int rmoe_config_check(const struct rmoe_layer_config *cfg, int nranks);

/* Stripes of a node-crossing ring hop, at most (scheduler/stripes.c). */
#define RMOE_STRIPES_MAX 16

/* The ring's receive buffers per relayed kind: cfg->window, 0 giving
 * RMOE_WINDOW_DEFAULT (double buffering). */
#define RMOE_WINDOW_DEFAULT 2
int rmoe_config_window(const struct rmoe_layer_config *cfg);

/* A 64-bit digest of every field that must agree across ranks. */
uint64_t rmoe_config_hash(const struct rmoe_layer_config *cfg);

/* Table 3 of the paper (and ../shared/notes/targets.md), each model's MoE
 * block as its published configuration has it: whether the top-k
 * probabilities are renormalised (norm_topk_prob), the shared expert's
 * width and whether a sigmoid gate scales it. */
struct rmoe_preset {
	const char *name;
	int layers;
	int64_t hidden, ffn, experts, topk;
	int norm_topk;
	int64_t shared_ffn;
	int shared_gated;
	int64_t heads, kv_heads, head_dim;  /* attention, for the recompute planner */
};
const struct rmoe_preset *rmoe_preset_find(const char *name);
const struct rmoe_preset *rmoe_preset_list(size_t *count);

/* Tokens per rank of a preset before scaling: B*S/(SP*CP) of the paper's
 * memory profile (§2: micro-batch 24, sequence 16384, SP=2, CP=4). */
#define RMOE_PRESET_TOKENS 49152

/* A preset's shape into cfg: hidden, ffn, tokens (RMOE_PRESET_TOKENS) and
 * shared_ffn divided by scale, experts and topk as they are, and its
 * routing (norm_topk, shared_gated). 0, or
 * RMOE_EINVAL with msg naming an unknown preset (and the known ones) or a
 * scale that leaves a size below 1. */
int rmoe_preset_apply(const char *name, double scale, struct rmoe_layer_config *cfg, char *msg, size_t len);

/* ---- ownership ------------------------------------------------------------ */

/* Floats of one expert's weights (gate + up + down) and of a partition. */
static inline int64_t rmoe_expert_floats(int64_t hidden, int64_t ffn)
{
	return 3 * hidden * ffn;
}

#ifdef __cplusplus
}
#endif

#endif
