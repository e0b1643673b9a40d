/* The StarPU side of the codelets, private to codelets/: the argument
 * structs tasks carry (STARPU_CL_ARGS, freed by StarPU; args.c, with the
 * checks of the shapes they carry), on the runtime plumbing
 * (runtime/rmoe_cl_runtime.h: the prologue, the insert), and what differs
 * between the real and the simulated build (whose cost models sim_cost.h
 * declares). */
#ifndef RMOE_CODELET_H
#define RMOE_CODELET_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <starpu.h>

#include "rmoe_cl_runtime.h"
#include "rmoe_codelets.h"
#include "rmoe_config.h"
#include "rmoe_kernels.h"
#include "rmoe_scheduler.h"

/* ---- argument structs ---------------------------------------------------------- */

/* scratch, in the structs that have it: the elements of the task's last
 * buffer, its device scratch (rmoe_cl_scratch), 0 when it has none. */
struct rmoe_router_args {
	int64_t tokens, hidden, experts, topk;
	int norm_topk;
	int64_t scratch;
};

struct rmoe_dispatch_map_args {
	int64_t tokens, topk, experts;
	int64_t scratch;
};

/* peer-counts and dedup-map (codelet_dedup.c) */
struct rmoe_dedup_args {
	int64_t tokens, topk, experts, ranks;
	int64_t first, count, distinct;
};

/* gather, scatter-add, unpermute-bwd */
struct rmoe_rows_args {
	int64_t first, count, hidden, topk;
	int weighted;
	int deterministic;              /* scatter-add: additions in the CPU kernel's order */
	int64_t scratch;
};

enum rmoe_expert_bwd_mode {
	RMOE_BWD_PAIR_WEIGHTED = 0,     /* ring, §3.3: routing weights applied in the kernel */
	RMOE_BWD_PREWEIGHTED = 1,       /* Megatron's all-to-all, shared expert */
	/* pair-weighted without a dx [T*H] target: the rows' dx stay in the x
	 * rows (the lean all-to-all sends them back to their tokens' ranks) */
	RMOE_BWD_PAIR_ROWS = 2,
};

/* expert-ffn, recompute, expert-bwd */
struct rmoe_expert_args {
	int64_t hidden, ffn, n_experts, rows;
	int mode;                       /* expert-bwd: enum rmoe_expert_bwd_mode */
	int accumulate;                 /* expert-bwd: 1 = dweights added to */
	int64_t first, topk;            /* pair-weighted backward: slice of pair_order */
	int deterministic;              /* pair-weighted backward: dx added in the CPU kernel's order */
	int64_t scratch;
	int64_t rows_per_expert[];      /* n_experts entries, summing to rows */
};

/* shared-gate-fwd, shared-gate-bwd */
struct rmoe_shared_gate_args {
	int64_t tokens, hidden;
	int64_t scratch;
};

/* accumulate, zero */
struct rmoe_accumulate_args {
	int64_t count;
};

struct rmoe_copy_pad_args {
	int64_t n_src, n_dst;
};

struct rmoe_sort_args {
	int64_t hidden, n_peers, n_experts;
	int direction;
	int64_t counts[];               /* n_peers * n_experts */
};

size_t rmoe_expert_args_size(int64_t n_experts);
/* A malloc'ed argument struct of an expert task of shape s (mode 0, no
 * accumulation), or NULL. */
struct rmoe_expert_args *rmoe_expert_args_from(const struct rmoe_expert_shape *s);
size_t rmoe_sort_args_size(int64_t n_peers, int64_t n_experts);

/* ---- the codelets' own checks ------------------------------------------------------ */

/* The prologue of the row codelets (gather, scatter-add, unpermute-bwd),
 * whose buffers are, in the order roles spells them: 'T' a [T*H] token
 * matrix, 'R' the slice's [count*H] rows, 'P' the pair order [T*K] (int32),
 * 'W' or 'G' a [T*K] vector (routing weights, their gradient); names name
 * them. Checks the arguments, a pair order of a multiple of K pairs holding
 * the slice, then the buffers as rmoe_cl_unpack; on the CPU (host != 0)
 * also that every pair of the slice is a pair of the order, which a device
 * kernel could not report. 0 or -1 after reporting. */
int rmoe_cl_rows_unpack(const char *op, void *buffers[], const struct rmoe_rows_args *a, const char *roles,
                        const char *const *names, int host, void **ptr);

/* The shape of a grouped expert task: non-negative sizes that CBLAS takes,
 * and rows_per_expert summing to rows. 0, or -1 after reporting. */
int rmoe_expert_args_check(const char *op, const struct rmoe_expert_args *a);

/* ---- real and simulated builds -------------------------------------------------------- */

/* A codelet definition: its StarPU name, the body of its CPU function (run
 * between the prologue's conversions and rmoe_cl_done), its CUDA function
 * (used only in builds with CUDA codelets), its perfmodel
 * (symbol sym, simulated by rmoe_sim_cost_<op>) and buffer count (modes
 * come with each insertion, rmoe_cl_insert). */
#define RMOE_CODELET(var, label, body, cuda, sym, op, nbuf)                                          \
	static void var##_cpu(void *buffers[], void *cl_arg)                                            \
	{                                                                                               \
		if (rmoe_cl_begin(cl_arg))                                                              \
			body(buffers, rmoe_cl_payload(cl_arg));                                         \
		rmoe_cl_done();                                                                         \
	}                                                                                               \
	RMOE_CL_CUDA_WRAPPER(var, cuda)                                                                 \
	static struct starpu_perfmodel var##_model = RMOE_PERFMODEL(sym, op);                           \
	static struct starpu_codelet var = {.name = (label), RMOE_CL_FUNCS(var##_cpu, var##_cuda).nbuffers = (nbuf), \
	                                    .model = &var##_model}

/* A codelet with a CPU function only (small index work on the host;
 * StarPU brings its buffers there), wrapped as RMOE_CODELET's are; with
 * always set, its body runs after a failure of its pass too (an index task
 * whose outputs another rank reads: garbage there would fail that rank
 * first and hide the failure that happened here). */
#ifdef STARPU_SIMGRID
/* The simulated GPUs run it too (nothing runs: the cost model times it). */
#define RMOE_CL_CPU_ONLY(cpu) .cpu_funcs = {cpu}, .cpu_funcs_name = {#cpu}, .cuda_funcs = {cpu},
#else
#define RMOE_CL_CPU_ONLY(cpu) .cpu_funcs = {cpu}, .cpu_funcs_name = {#cpu},
#endif
#define RMOE_CODELET_CPU(var, label, body, sym, op, nbuf, always)                                    \
	static void var##_cpu(void *buffers[], void *cl_arg)                                            \
	{                                                                                               \
		if ((always) || rmoe_cl_begin(cl_arg))                                                  \
			body(buffers, rmoe_cl_payload(cl_arg));                                         \
		rmoe_cl_done();                                                                         \
	}                                                                                               \
	static struct starpu_perfmodel var##_model = RMOE_PERFMODEL(sym, op);                           \
	static struct starpu_codelet var = {.name = (label), RMOE_CL_CPU_ONLY(var##_cpu).nbuffers = (nbuf), \
	                                    .model = &var##_model}

/* The one place the codelets differ between builds.
 *
 * Perfmodels: the real build records history-based models (the dm*
 * policies place work with them); the simulation (StarPU's SimGrid mode)
 * runs no kernel, and a task lasts what the analytic cost model of its
 * operation says.
 *
 * Implementations: a codelet offers its CPU function, and its CUDA function
 * in builds with CUDA codelets, asynchronous on the worker's stream (StarPU
 * does not synchronise after it). StarPU lets a task go to a worker only if
 * the codelet has a function for that worker's kind; the simulated GPUs of
 * the SimGrid build run nothing, so there the operation's CPU function
 * stands as its implementation on the simulated device (never called: the
 * cost model gives the duration). */
#ifdef RMOE_HAVE_CUDA
/* The CUDA function behind the same head as the CPU one. */
#define RMOE_CL_CUDA_WRAPPER(var, cuda)                                                                 \
	static void var##_cuda(void *buffers[], void *cl_arg)                                           \
	{                                                                                               \
		if (rmoe_cl_begin(cl_arg))                                                              \
			cuda(buffers, rmoe_cl_payload(cl_arg));                                         \
	}
#else
#define RMOE_CL_CUDA_WRAPPER(var, cuda)
#endif

#ifdef STARPU_SIMGRID
#include "sim_cost.h"
#define RMOE_PERFMODEL(sym, op) {.type = STARPU_PER_ARCH, .arch_cost_function = rmoe_sim_cost_##op, .symbol = (sym)}
#define RMOE_CL_FUNCS(cpu, cuda) .cpu_funcs = {cpu}, .cpu_funcs_name = {#cpu}, .cuda_funcs = {cpu},
#elif defined(RMOE_HAVE_CUDA)
#define RMOE_PERFMODEL(sym, op) {.type = STARPU_HISTORY_BASED, .symbol = (sym)}
#define RMOE_CL_FUNCS(cpu, cuda)                                                                        \
	.cpu_funcs = {cpu}, .cpu_funcs_name = {#cpu}, .cuda_funcs = {cuda}, .cuda_flags = {STARPU_CUDA_ASYNC},
#else
#define RMOE_PERFMODEL(sym, op) {.type = STARPU_HISTORY_BASED, .symbol = (sym)}
#define RMOE_CL_FUNCS(cpu, cuda) .cpu_funcs = {cpu}, .cpu_funcs_name = {#cpu},
#endif

#endif /* RMOE_CODELET_H */
