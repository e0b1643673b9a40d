/* The tasks of a pass: inserted under its window and gate (window.c says
 * why), one chunk of a hop (chunk_tasks.c), their names (task_names.c) and
 * priorities. Private to graph/. */
#ifndef RMOE_TASKS_H
#define RMOE_TASKS_H

#include <starpu.h>
#include <stdint.h>

#include "rmoe_chunks.h"
#include "rmoe_codelets.h"
#include "rmoe_layer_impl.h"
#include "rmoe_pass.h"

/* Options for a task of L named name at priority prio. */
struct rmoe_task_opts rmoe_opts(const struct rmoe_layer *L, const char *name, int prio);

/* Gathers given a pass wait for its window; expert tasks and scatter-adds
 * given an anchor pass become its window (and the pair-weighted backward
 * also waits for the gate); an accumulate given a gate pass becomes its
 * gate; a zeroing given a pass waits for its window. */
int rmoe_pass_gather(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_routing *rt,
                     starpu_data_handle_t src, int64_t first, int64_t count, int weighted,
                     starpu_data_handle_t rows, int prio, const char *name);
int rmoe_pass_scatter_add(struct rmoe_layer *L, struct rmoe_pass *anchor, const struct rmoe_routing *rt,
                          starpu_data_handle_t rows, int64_t first, int64_t count, int weighted,
                          starpu_data_handle_t dst, int prio, const char *name);
int rmoe_pass_expert_ffn(struct rmoe_layer *L, struct rmoe_pass *anchor, starpu_data_handle_t rows,
                         starpu_data_handle_t w, int64_t n_experts, int64_t ffn, const int64_t *rows_per_expert,
                         int64_t nrows, starpu_data_handle_t work, starpu_data_handle_t out, int prio,
                         const char *name);
int rmoe_pass_expert_bwd_pairs(struct rmoe_layer *L, struct rmoe_pass *anchor, const struct rmoe_routing *rt,
                               starpu_data_handle_t xrows, starpu_data_handle_t dyrows, starpu_data_handle_t w,
                               const struct rmoe_chunk *c, starpu_data_handle_t work, starpu_data_handle_t dx,
                               starpu_data_handle_t dw, int accumulate, int prio, const char *name);
int rmoe_pass_accumulate(const struct rmoe_layer *L, struct rmoe_pass *gate_pass,
                         starpu_data_handle_t src, starpu_data_handle_t dst,
                         int64_t count, int prio, const char *name);
int rmoe_pass_zero(const struct rmoe_layer *L, struct rmoe_pass *pass, starpu_data_handle_t dst,
                   int64_t count, int prio, const char *name);

/* An ordering task of the pass (rmoe_insert_fence: after the writers of
 * ready and every earlier access of next; every later access of next after
 * it), also after the task after (may be NULL). With kept it is kept as an
 * anchor until the pass ends and returned there, for later tasks to wait
 * for (their options' after). */
int rmoe_pass_fence(struct rmoe_layer *L, struct rmoe_pass *pass, const starpu_data_handle_t *ready, int nready,
                    const starpu_data_handle_t *next, int nnext, struct starpu_task *after, struct starpu_task **kept,
                    const char *name);

/* One chunk of a hop, forward (§3.1): gather the chunk's rows of x,
 * grouped SwiGLU over the partition whose weights are w, weighted
 * scatter-add into acc. The rows, workspace and outputs are temporaries
 * freed when their last task ends. */
int rmoe_chunk_forward(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_routing *rt,
                       starpu_data_handle_t x, starpu_data_handle_t w, const struct rmoe_chunk *c,
                       starpu_data_handle_t acc, int prio, int hop);

/* One chunk of a hop, backward (§3.3: reconstruct, consume, release
 * within the hop): gather the rows of x and dy, recompute the
 * intermediates, and the pair-weighted expert backward into dx, rt's dg and
 * the weight gradient dw (added to when accumulate). */
int rmoe_chunk_backward(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_routing *rt,
                        starpu_data_handle_t x, starpu_data_handle_t dy, starpu_data_handle_t w,
                        const struct rmoe_chunk *c, starpu_data_handle_t dx, starpu_data_handle_t dw, int accumulate,
                        int prio, int hop);

/* "op hN": a task name that lives as long as the process (StarPU keeps the
 * pointer); hop < 0 gives the bare op. */
const char *rmoe_task_name(const char *op, int hop);

/* Earlier hops first; transfers above the compute of their hop. */
static inline int rmoe_prio_hop(int hop, int nhops)
{
	return 2 * (nhops - hop);
}

#endif /* RMOE_TASKS_H */
