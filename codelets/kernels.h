/* Helpers shared by the CPU codelets of relaymoe: the SwiGLU pieces, a dot
 * product, the expert-weight layout and the checks of a task's buffers.
 * Internal to codelets/.
 */
#ifndef RMOE_KERNELS_H
#define RMOE_KERNELS_H

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <starpu.h>

#include "rmoe_codelets.h"

/* A buffer or argument that does not match is a bug in the graph that built
 * the task. STARPU_ASSERT_MSG names it; with NDEBUG it only prints, so the
 * kernel then returns instead of reading or writing out of bounds. */
#define RMOE_CL_CHECK(cond, fmt, ...)                                              \
	do {                                                                       \
		if (STARPU_UNLIKELY(!(cond))) {                                    \
			STARPU_ASSERT_MSG(cond, fmt, ##__VA_ARGS__);               \
			return;                                                    \
		}                                                                  \
	} while (0)

/* Vector buffer i holds exactly n elements. */
#define RMOE_CL_CHECK_NX(buffers, i, n, what)                                      \
	RMOE_CL_CHECK((int64_t)STARPU_VECTOR_GET_NX((buffers)[i]) == (int64_t)(n),  \
	              "%s: buffer %d (%s) has %lld elements, expected %lld",       \
	              __func__, (int)(i), (what),                                  \
	              (long long)STARPU_VECTOR_GET_NX((buffers)[i]), (long long)(n))

static inline int64_t rmoe_cl_nx(void *buffer)
{
	return (int64_t)STARPU_VECTOR_GET_NX(buffer);
}

/* The number of buffers of the running task (codelets with
 * STARPU_VARIABLE_NBUFFERS, or one CPU function shared by two codelets). */
static inline int rmoe_cl_nbuffers(void)
{
	struct starpu_task *task = starpu_task_get_current();
	return task ? (int)STARPU_TASK_GET_NBUFFERS(task) : -1;
}

/* A dimension passed to CBLAS (int). */
static inline int rmoe_blas_dim_ok(int64_t n)
{
	return n >= 0 && n <= INT_MAX;
}

/* Sigmoid without overflow of expf for large |g|. */
static inline float rmoe_sigmoid(float g)
{
	if (g >= 0.0f)
		return 1.0f / (1.0f + expf(-g));
	float z = expf(g);
	return z / (1.0f + z);
}

static inline float rmoe_silu(float g)
{
	return g * rmoe_sigmoid(g);
}

/* Accumulated in double: dg and the router's dot products sum over H or F
 * terms of mixed signs. */
static inline float rmoe_dot(const float *a, const float *b, int64_t n)
{
	double s = 0.0;
	for (int64_t i = 0; i < n; i++)
		s += (double)a[i] * (double)b[i];
	return (float)s;
}

/* Partition weights: gate [ne][H][F] | up [ne][H][F] | down [ne][F][H]. */
static inline int64_t rmoe_partition_weights_count(int64_t n_experts, int64_t hidden, int64_t ffn)
{
	return 3 * n_experts * hidden * ffn;
}

static inline float *rmoe_w_gate(float *w, int64_t n_experts, int64_t hidden, int64_t ffn, int64_t e)
{
	(void)n_experts;
	return w + e * hidden * ffn;
}

static inline float *rmoe_w_up(float *w, int64_t n_experts, int64_t hidden, int64_t ffn, int64_t e)
{
	return w + (n_experts + e) * hidden * ffn;
}

static inline float *rmoe_w_down(float *w, int64_t n_experts, int64_t hidden, int64_t ffn, int64_t e)
{
	return w + (2 * n_experts + e) * hidden * ffn;
}

/* The first i in [0, count) whose pair pair_order[first + i] is not in
 * [0, n_pairs), or -1 when all are. */
static inline int64_t rmoe_first_bad_pair(const int32_t *pair_order, int64_t first, int64_t count,
                                          int64_t n_pairs)
{
	for (int64_t i = 0; i < count; i++)
		if (pair_order[first + i] < 0 || pair_order[first + i] >= n_pairs)
			return i;
	return -1;
}

/* The shape of a grouped expert task: non-negative sizes that CBLAS takes,
 * and rows_per_expert summing to rows. */
static inline int rmoe_expert_args_ok(const struct rmoe_expert_args *a)
{
	if (a->n_experts < 0 || !rmoe_blas_dim_ok(a->hidden) || !rmoe_blas_dim_ok(a->ffn) ||
	    !rmoe_blas_dim_ok(a->rows))
		return 0;
	int64_t sum = 0;
	for (int64_t e = 0; e < a->n_experts; e++) {
		if (a->rows_per_expert[e] < 0)
			return 0;
		sum += a->rows_per_expert[e];
	}
	return sum == a->rows;
}

/* ---- simulation (StarPU's SimGrid mode) ----------------------------------- */

/* Analytic cost models (sim_cost.c), in microseconds for one task on the
 * arch: floor + max(flops / rate, bytes / bandwidth). */
void rmoe_sim_cost_init(void);
double rmoe_sim_time_us(int gpu, double flops, double bytes);
double rmoe_sim_cost_router_fwd(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_router_bwd(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_dispatch_map(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_rows(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_unpermute_bwd(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_expert_ffn(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_expert_bwd(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_accumulate(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_sort_chunks(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);

/* The one place the codelets differ between the real and the simulated
 * build. Under SimGrid no kernel runs: a codelet that names a CUDA function
 * (never called) can go to a simulated GPU, and its duration comes from the
 * analytic model. The real build keeps its history-based models. */
#ifdef STARPU_SIMGRID
#define RMOE_SIM_CUDA_FUNCS .cuda_funcs = {(starpu_cuda_func_t)1},
#define RMOE_PERFMODEL(sym, sim_cost) {.type = STARPU_PER_ARCH, .arch_cost_function = (sim_cost), .symbol = (sym)}
#else
#define RMOE_SIM_CUDA_FUNCS
#define RMOE_PERFMODEL(sym, sim_cost) {.type = STARPU_HISTORY_BASED, .symbol = (sym)}
#endif

#endif /* RMOE_KERNELS_H */
