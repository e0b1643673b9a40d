/* scheduler/: decisions taken before a graph is built, as pure functions
 * (no StarPU, no MPI), so they are unit-testable on their own: configuration
 * checks and presets, expert ownership, error reporting. */
#ifndef RMOE_SCHEDULER_H
#define RMOE_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>
#include "relaymoe/relaymoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors: set the thread's last message and return code -------------- */
int rmoe_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The message of the thread's last error ("" if none). */
const char *rmoe_last_error_message(void);
void rmoe_error_clear(void);

/* ---- files ----------------------------------------------------------------- */
/* mkdir -p: 0, or the errno of the part that failed (ENOTDIR: a file is
 * there). */
int rmoe_mkdir_p(const char *dir);

/* ---- configuration ------------------------------------------------------ */

/* Checks every value of cfg for a group of nranks ranks; 0 or RMOE_EINVAL /
 * RMOE_ENOTSUP with a message naming the value and what was expected. */
int rmoe_config_check(const struct rmoe_layer_config *cfg, int nranks, int have_cuda);

/* A 64-bit digest of every field that must agree across ranks. */
uint64_t rmoe_config_hash(const struct rmoe_layer_config *cfg);

/* Table 3 of the paper (and ../shared/notes/targets.md). */
struct rmoe_preset {
	const char *name;
	int layers;
	int64_t hidden, ffn, experts, topk;
	int64_t shared_ffn;
	int64_t heads, kv_heads, head_dim;  /* attention, for the recompute planner */
};
const struct rmoe_preset *rmoe_preset_find(const char *name);
const struct rmoe_preset *rmoe_preset_list(size_t *count);

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
