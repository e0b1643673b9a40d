/* The unpack and check prologue every codelet function starts with, and the
 * fp32 copies it hands a CPU kernel for the task's bf16 buffers. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rmoe_cl_probe.h"
#include "rmoe_cl_runtime.h"
#include "rmoe_system.h"

int rmoe_cl_fail(const char *op, const char *fmt, ...)
{
	char msg[448];
	int n = snprintf(msg, sizeof(msg), "%s: ", op);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
	va_end(ap);
	struct starpu_task *t = starpu_task_get_current();
	return rmoe_task_status_record(rmoe_cl_status(), RMOE_ESTARPU, t && t->name ? t->name : op, msg);
}

void rmoe_cl_test_delay(void)
{
	/* -1: not read yet; racing first reads store the same value. */
	static long delay_us = -1;
	long d = __atomic_load_n(&delay_us, __ATOMIC_RELAXED);
	if (d < 0) {
		const char *v = rmoe_env(RMOE_ENV_TEST_EXPERT_DELAY_US);
		char *end = NULL;
		long parsed = v ? strtol(v, &end, 10) : 0;
		d = v && end != v && *end == '\0' && parsed > 0 && parsed <= 10000000 ? parsed : 0;
		__atomic_store_n(&delay_us, d, __ATOMIC_RELAXED);
	}
	if (d > 0)
		usleep((useconds_t)d);
}

/* The fp32 copies of the bf16 buffers of the task running on this CPU
 * worker (one task at a time per worker thread). */
#define RMOE_CL_MAXCOPIES 80
static _Thread_local struct {
	struct {
		uint16_t *orig;
		float *copy;
		int64_t n;
		int write;
	} b[RMOE_CL_MAXCOPIES];
	int n;
} copies;

/* Rounds the written copies back (writeback) and frees them all. */
static void copies_release(int writeback)
{
	for (int i = 0; i < copies.n; i++) {
		if (writeback && copies.b[i].write)
			rmoe_kernel_to_bf16(copies.b[i].n, copies.b[i].copy, copies.b[i].orig);
		free(copies.b[i].copy);
	}
	copies.n = 0;
}

void rmoe_cl_done(void)
{
	copies_release(1);
}

/* An fp32 copy of bf16 buffer i of task for a CPU kernel; NULL when out of
 * memory. */
static float *copy_of(struct starpu_task *task, void *buffer, int i)
{
	if (copies.n == RMOE_CL_MAXCOPIES)
		return NULL;
	const int64_t n = (int64_t)STARPU_VECTOR_GET_NX(buffer);
	const enum starpu_data_access_mode mode = STARPU_TASK_GET_MODE(task, i);
	uint16_t *orig = (uint16_t *)STARPU_VECTOR_GET_PTR(buffer);
	/* A write-only buffer's contents are undefined: zeros, not garbage. */
	float *copy = (mode & STARPU_R) ? malloc((size_t)(n > 0 ? n : 1) * sizeof(float))
	                                : calloc((size_t)(n > 0 ? n : 1), sizeof(float));
	if (!copy)
		return NULL;
	if (mode & STARPU_R)
		rmoe_kernel_from_bf16(n, orig, copy);
	copies.b[copies.n].orig = orig;
	copies.b[copies.n].copy = copy;
	copies.b[copies.n].n = n;
	copies.b[copies.n].write = (mode & STARPU_W) != 0;
	copies.n++;
	return copy;
}

int rmoe_cl_unpack(const char *op, void *buffers[], const struct rmoe_cl_buffer *spec, int nspec, void **ptr)
{
	/* The heap is sampled where a task may allocate host memory, on a CPU
	 * worker (its bf16 copies, BLAS buffers); a CUDA task's prologue
	 * leaves it to the sampler thread: mallinfo2 walks the arenas under
	 * their lock, tens of microseconds in front of every device task. */
	const int worker = starpu_worker_get_id();
	rmoe_probe_sample(worker < 0 || starpu_worker_get_type(worker) == STARPU_CPU_WORKER);
	/* A previous task that failed its checks left its copies: not written. */
	copies_release(0);
	struct starpu_task *task = starpu_task_get_current();
	int nbuffers = task ? (int)STARPU_TASK_GET_NBUFFERS(task) : -1;
	if (nbuffers != nspec)
		return rmoe_cl_fail(op, "%d buffers, expected %d", nbuffers, nspec);
	const int on_cpu = starpu_worker_get_type(starpu_worker_get_id()) == STARPU_CPU_WORKER;
	const int injected = rmoe_cl_fault_injected();
	for (int i = 0; i < nspec; i++) {
		/* RMOE_FAULT_TASK: this task's first buffer seen one short. */
		int64_t nx = (int64_t)STARPU_VECTOR_GET_NX(buffers[i]) - (injected && i == 0);
		if (nx != spec[i].n && nx != spec[i].alt)
			return rmoe_cl_fail(op, "buffer %d (%s) has %lld elements, expected %lld%s", i, spec[i].what,
			                    (long long)nx, (long long)spec[i].n, injected ? " (RMOE_FAULT_TASK)" : "");
		ptr[i] = (void *)STARPU_VECTOR_GET_PTR(buffers[i]);
		if (on_cpu && rmoe_cl_elsize(buffers[i]) == 2 && !(ptr[i] = copy_of(task, buffers[i], i))) {
			copies_release(0);
			return rmoe_cl_fail(op, "no memory for an fp32 copy of buffer %d (%s, %lld bf16 elements)", i,
			                    spec[i].what, (long long)nx);
		}
	}
	return 0;
}

int rmoe_cl_dim_ok(int64_t n)
{
	return n >= 0 && n <= INT_MAX;
}
