/* The runtime plumbing every codelet stands on, private to codelets/: the
 * head of a task's arguments and its pass's status (status.c), device
 * scratch (scratch.c), the cuBLAS handle of a CUDA worker (cuda.c), the one
 * unpack and check prologue every codelet function starts with
 * (prologue.c), and the one way a task is submitted (insert.c). Knows
 * StarPU, not the codelets' argument structs (codelet.h). */
#ifndef RMOE_CL_RUNTIME_H
#define RMOE_CL_RUNTIME_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <starpu.h>

#include "rmoe_codelets.h"
#include "rmoe_config.h"
#include "rmoe_error.h"
#include "rmoe_kernels.h"
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
/* A task's end callback when its opts name a task log (task_log.c). */
void rmoe_task_log_line(void *log);
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

/* A dimension CBLAS takes (int). */
int rmoe_cl_dim_ok(int64_t n);

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

#endif /* RMOE_CL_RUNTIME_H */
