/* The StarPU side of the codelets, private to codelets/: the argument
 * structs tasks carry (STARPU_CL_ARGS, freed by StarPU; args.c), the one
 * unpack and check prologue every codelet function starts with
 * (prologue.c), the one way a task is submitted (insert.c), and what
 * differs between the real and the simulated build (whose cost models
 * sim_cost.h declares). */
#ifndef RMOE_CODELET_H
#define RMOE_CODELET_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <starpu.h>

#include "rmoe_codelets.h"
#include "rmoe_config.h"
#include "rmoe_kernels.h"
#include "rmoe_scheduler.h"
#ifdef RMOE_HAVE_CUDA
#include <starpu_cuda.h>

#include "rmoe_kernels_cuda.h"

/* The running CUDA worker's cuBLAS handle (cuda.c), on its stream. */
cublasHandle_t rmoe_cl_cublas(void);
/* After a CUDA kernel's launcher returned rc (0 or an enum
 * rmoe_cuda_status): 0, or -1 after reporting. */
int rmoe_cl_cuda_done(const char *op, int rc);
#define RMOE_STREAM starpu_cuda_get_local_stream()
/* The running task's device scratch for its launcher: its last buffer
 * when the argument struct says it has one (scratch elements > 0,
 * rmoe_cl_scratch), else none (the launcher allocates what it needs). */
static inline struct rmoe_cuda_scratch rmoe_cl_cuda_scratch(void *buffers[], int64_t scratch)
{
	struct rmoe_cuda_scratch sc = {NULL, 0};
	struct starpu_task *task = starpu_task_get_current();
	if (scratch > 0 && task) {
		void *b = buffers[STARPU_TASK_GET_NBUFFERS(task) - 1];
		sc.p = (void *)STARPU_VECTOR_GET_PTR(b);
		sc.bytes = (size_t)STARPU_VECTOR_GET_NX(b) * STARPU_VECTOR_GET_ELEMSIZE(b);
	}
	return sc;
}
#endif

/* ---- the head of a task's arguments ---------------------------------------------------- */

/* Every task with a function gets its argument struct behind this head
 * (rmoe_cl_insert; status.c), so that whatever fails in it finds the status
 * of its pass (rmoe_cl_fail): Chameleon passes its sequence and request
 * the same way. The codelet functions see only the struct after it. */
struct rmoe_cl_head {
	struct rmoe_task_status *status;
};
/* The payload keeps malloc's alignment. */
#define RMOE_CL_HEAD_BYTES ((size_t)_Alignof(max_align_t))
_Static_assert(RMOE_CL_HEAD_BYTES >= sizeof(struct rmoe_cl_head), "the head fits its alignment");
/* A malloc'ed head for status followed by a copy of the argsize bytes of
 * args, which it frees (NULL: none); NULL when out of memory. */
void *rmoe_cl_args_with_head(struct rmoe_task_status *status, void *args, size_t argsize);
static inline void *rmoe_cl_payload(void *cl_arg)
{
	return cl_arg ? (char *)cl_arg + RMOE_CL_HEAD_BYTES : NULL;
}
/* Whether the task whose cl_arg this is should run: 0 once its pass has
 * failed. */
int rmoe_cl_begin(void *cl_arg);
/* The status of the running task (the default one outside a task). */
struct rmoe_task_status *rmoe_cl_status(void);
/* Whether the running task is the one RMOE_FAULT_TASK names (status.c). */
int rmoe_cl_fault_injected(void);

/* ---- device scratch ---------------------------------------------------------------- */

/* The device scratch of a task of op about to be inserted, as a
 * STARPU_SCRATCH buffer, so that StarPU allocates it on the node of the
 * worker that runs the task and counts it with the task's data: a fresh
 * handle of bytes (4-byte elements, rounded up) in *d, to append as the
 * task's last buffer, and its elements in *n for the codelet's argument
 * struct. Only where StarPU has CUDA workers and bytes > 0 (a CPU worker
 * that runs the task then gets it too, and leaves it alone); otherwise *n
 * = 0 and d->handle NULL. 0 or an RMOE_E* code. After the insert, whatever
 * it returned, rmoe_cl_scratch_release(d). scratch.c */
int rmoe_cl_scratch(const char *op, size_t bytes, struct starpu_data_descr *d, int64_t *n);
void rmoe_cl_scratch_release(struct starpu_data_descr *d);

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

/* ---- the prologue ------------------------------------------------------------------ */

/* What buffer i of a task must be: n elements (one of two counts when alt
 * >= 0, e.g. a workspace of either layout), named for the message. */
struct rmoe_cl_buffer {
	const char *what;
	int64_t n, alt;
};
#define RMOE_CL_BUF(what, n) {(what), (n), -1}

/* Every codelet function starts here: samples the memory probe, checks that
 * the running task has exactly nspec buffers of the sizes spec says, and
 * returns their pointers in ptr (device pointers on a device). 0, or -1
 * after reporting which buffer and what was expected: a task that does not
 * match is a bug in the graph that built it, and the function returns
 * without reading or writing out of bounds (STARPU_ASSERT_MSG aborts first
 * in builds with assertions).
 * On a CPU worker a bf16 buffer (2-byte elements) is handed to the kernel
 * as an fp32 copy (converted in when the task reads it): the CPU kernels
 * compute in fp32 through OpenBLAS, which has no bf16 GEMM. rmoe_cl_done,
 * which every CPU function of RMOE_CODELET runs after its body, rounds the
 * copies the task writes back to bf16 and frees them. */
int rmoe_cl_unpack(const char *op, void *buffers[], const struct rmoe_cl_buffer *spec, int nspec, void **ptr);
void rmoe_cl_done(void);

/* The element size of a vector buffer: 4 (float32, int32) or 2 (bf16). */
static inline size_t rmoe_cl_elsize(void *buffer)
{
	return STARPU_VECTOR_GET_ELEMSIZE(buffer);
}

/* Records a bad argument or buffer of op in the running task's status
 * (the message starts with op) and prints it; returns -1. The caller then
 * returns without further work: builds with and without assertions alike
 * (it is no assertion), the layer call returns RMOE_ESTARPU naming the
 * task on every rank. */
int rmoe_cl_fail(const char *op, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A test hook: with RMOE_TEST_EXPERT_DELAY_US set in a process's
 * environment (read at its first expert task), each expert task on a CPU
 * sleeps that many microseconds first. One slowed rank lets its left
 * neighbour run ahead on the ring (tests/mpi/test_flow.c). */
void rmoe_cl_test_delay(void);

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

/* A dimension CBLAS takes (int). */
int rmoe_cl_dim_ok(int64_t n);

/* The shape of a grouped expert task: non-negative sizes that CBLAS takes,
 * and rows_per_expert summing to rows. 0, or -1 after reporting. */
int rmoe_expert_args_check(const char *op, const struct rmoe_expert_args *a);

/* Memory probe (probe.c): called by rmoe_cl_unpack and the sampler
 * thread (sampler.c); samples the heap probe too (heap.c). Each returns
 * the level it read (the probe: StarPU's bytes on every node plus the
 * heap's), which the sampler watches for change. */
int64_t rmoe_probe_sample(void);
int64_t rmoe_heap_sample(void);

/* ---- submission --------------------------------------------------------------------- */

/* The one way a task of the library is inserted: cl on the nd buffers of d
 * (their access modes given here, also for codelets that fix them), the
 * argument struct args of argsize bytes (malloc'ed; StarPU frees it; NULL
 * means its allocation failed, unless argsize is 0: a task without
 * arguments), flops (0: unknown), with what o asks:
 * name, priority, trace colour, a task to wait for, a task kept. 0, or an
 * RMOE_E* code naming the codelet; args is freed on failure. */
int rmoe_cl_insert(const struct rmoe_task_opts *o, struct starpu_codelet *cl, struct starpu_data_descr *d, int nd,
                   void *args, size_t argsize, double flops);

/* Access mode of an accumulator written by tasks of several hops. */
static inline enum starpu_data_access_mode rmoe_cl_acc_mode(const struct rmoe_task_opts *o)
{
	return o->deterministic ? STARPU_RW : STARPU_RW | STARPU_COMMUTE;
}

/* A copy of an argument struct for STARPU_CL_ARGS (StarPU frees it). */
void *rmoe_cl_args_dup(const void *args, size_t size);

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
