/* The unpack and check prologue every codelet function starts with, and the
 * fp32 copies it hands a CPU kernel for the task's bf16 buffers. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codelet.h"

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
		const char *v = getenv("RMOE_TEST_EXPERT_DELAY_US");
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
	rmoe_probe_sample();
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

int rmoe_cl_rows_unpack(const char *op, void *buffers[], const struct rmoe_rows_args *a, const char *roles,
                        const char *const *names, int host, void **ptr)
{
	const int64_t H = a->hidden, K = a->topk;
	if (!(H >= 1 && K >= 1 && a->first >= 0 && a->count >= 0))
		return rmoe_cl_fail(op, "bad arguments first=%lld count=%lld H=%lld K=%lld", (long long)a->first,
		                    (long long)a->count, (long long)H, (long long)K);
	const int nspec = (int)strlen(roles), ipairs = (int)(strchr(roles, 'P') - roles);
	struct starpu_task *task = starpu_task_get_current();
	if (!task || (int)STARPU_TASK_GET_NBUFFERS(task) <= ipairs)
		return rmoe_cl_fail(op, "no pair order buffer (buffer %d)", ipairs);
	const int64_t n_pairs = (int64_t)STARPU_VECTOR_GET_NX(buffers[ipairs]);
	if (n_pairs % K != 0)
		return rmoe_cl_fail(op, "%lld pairs, not a multiple of K=%lld", (long long)n_pairs, (long long)K);
	if (a->first + a->count > n_pairs)
		return rmoe_cl_fail(op, "slice [%lld, %lld) beyond %lld pairs", (long long)a->first,
		                    (long long)(a->first + a->count), (long long)n_pairs);
	struct rmoe_cl_buffer spec[8];
	for (int i = 0; i < nspec && i < 8; i++) {
		int64_t n = roles[i] == 'T' ? n_pairs / K * H : roles[i] == 'R' ? a->count * H : n_pairs;
		spec[i] = (struct rmoe_cl_buffer)RMOE_CL_BUF(names[i], n);
	}
	if (rmoe_cl_unpack(op, buffers, spec, nspec, ptr))
		return -1;
	int64_t bad = host ? rmoe_kernel_first_bad_pair(ptr[ipairs], a->first, a->count, n_pairs) : -1;
	if (bad >= 0)
		return rmoe_cl_fail(op, "pair_order[%lld] = %d, not a pair of %lld", (long long)(a->first + bad),
		                    (int)((const int32_t *)ptr[ipairs])[a->first + bad], (long long)n_pairs);
	return 0;
}

int rmoe_cl_dim_ok(int64_t n)
{
	return n >= 0 && n <= INT_MAX;
}

int rmoe_expert_args_check(const char *op, const struct rmoe_expert_args *a)
{
	int ok = a->n_experts >= 0 && rmoe_cl_dim_ok(a->hidden) && rmoe_cl_dim_ok(a->ffn) && rmoe_cl_dim_ok(a->rows);
	int64_t sum = 0;
	for (int64_t e = 0; ok && e < a->n_experts; e++) {
		ok = a->rows_per_expert[e] >= 0;
		sum += a->rows_per_expert[e];
	}
	if (ok && sum == a->rows)
		return 0;
	return rmoe_cl_fail(op, "bad shape H=%lld F=%lld experts=%lld rows=%lld (or rows_per_expert)",
	                    (long long)a->hidden, (long long)a->ffn, (long long)a->n_experts, (long long)a->rows);
}
