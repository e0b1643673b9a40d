/* What every codelet shares: set-up, the unpack and check prologue, task
 * submission, argument sizes and flop counts. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cblas.h>

#include "codelet.h"
#include "rmoe_config.h"
#include "rmoe_scheduler.h"

static atomic_flag rmoe_codelets_initialised = ATOMIC_FLAG_INIT;
static int rmoe_codelets_init_rc;

#ifdef RMOE_HAVE_OPENBLAS_SET_NUM_THREADS
/* Weak: the library then loads against any CBLAS (a reference BLAS where
 * OpenBLAS is not installed, as on the GPU machines bench/gpu/ packs for). */
#pragma weak openblas_set_num_threads
#pragma weak openblas_get_corename
#endif

int rmoe_codelets_init(void)
{
	if (atomic_flag_test_and_set(&rmoe_codelets_initialised))
		return rmoe_codelets_init_rc;
#ifdef RMOE_HAVE_OPENBLAS_SET_NUM_THREADS
	/* StarPU runs one worker per core: a BLAS call inside a task must not
	 * start threads of its own on the cores of the other workers. */
	if (openblas_set_num_threads)
		openblas_set_num_threads(1);
#endif
	rmoe_codelets_init_rc = rmoe_sim_cost_init();
	return rmoe_codelets_init_rc;
}

int rmoe_codelets_blas_threads(int n)
{
#ifdef RMOE_HAVE_OPENBLAS_SET_NUM_THREADS
	if (openblas_set_num_threads && n >= 1) {
		openblas_set_num_threads(n);
		return n;
	}
#else
	(void)n;
#endif
	return 0;
}

/* ---- OpenBLAS's kernel set ------------------------------------------------------ */

const char *rmoe_blas_core(void)
{
#ifdef RMOE_HAVE_OPENBLAS_SET_NUM_THREADS
	if (openblas_get_corename) {
		const char *name = openblas_get_corename();
		if (name && *name)
			return name;
	}
#endif
	return "unknown";
}

/* The vector width OpenBLAS's x86-64 kernel sets use: 1 SSE, 2 AVX, 3
 * AVX2, 4 AVX-512; 0 for a name not known here (no advice then). */
static int core_level(const char *core)
{
	static const char *const levels[][8] = {
		{"Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom", "Core2", "Penryn"},
		{"Dunnington", "Nehalem", "Athlon", "Opteron", "Opteron_SSE3", "Barcelona", "Nano", "Bobcat"},
		{"Sandybridge", "Bulldozer", "Piledriver", "Steamroller"},
		{"Haswell", "Zen", "Excavator"},
		{"SkylakeX", "Cooperlake", "SapphireRapids"},
	};
	static const int level_of_row[] = {1, 1, 2, 3, 4};
	for (size_t r = 0; r < sizeof(levels) / sizeof(levels[0]); r++)
		for (size_t i = 0; i < 8 && levels[r][i]; i++)
			if (!strcasecmp(core, levels[r][i]))
				return level_of_row[r];
	return 0;
}

/* OpenBLAS's dynamic build picks its kernels by CPU model number, and a
 * model newer than the library (Debian 12's 0.3.21 on a 5th-generation
 * Xeon, model 207, under KVM) falls back to the SSE3 kernels of
 * "Prescott": sgemm at 58 GFLOP/s on two cores where the AVX-512 kernels
 * the CPU supports run at 245 (bench/results/rate.md). OPENBLAS_CORETYPE,
 * read when the library loads, overrides the choice. */
const char *rmoe_blas_core_advice(void)
{
#if defined(RMOE_HAVE_OPENBLAS_SET_NUM_THREADS) && defined(__x86_64__) && defined(__GNUC__)
	const int have = core_level(rmoe_blas_core());
	if (have == 0)
		return NULL;
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
		return have < 4 ? "SkylakeX" : NULL;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return have < 3 ? "Haswell" : NULL;
	if (__builtin_cpu_supports("avx"))
		return have < 2 ? "Sandybridge" : NULL;
#endif
	return NULL;
}

/* ---- the prologue -------------------------------------------------------------- */

int rmoe_cl_fail(const char *op, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* With NDEBUG STARPU_ASSERT_MSG only prints; the caller then returns. */
	STARPU_ASSERT_MSG(0, "%s: %s", op, msg);
	return -1;
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
	for (int i = 0; i < nspec; i++) {
		int64_t nx = (int64_t)STARPU_VECTOR_GET_NX(buffers[i]);
		if (nx != spec[i].n && nx != spec[i].alt)
			return rmoe_cl_fail(op, "buffer %d (%s) has %lld elements, expected %lld", i, spec[i].what,
			                    (long long)nx, (long long)spec[i].n);
		ptr[i] = (void *)STARPU_VECTOR_GET_PTR(buffers[i]);
		if (on_cpu && rmoe_cl_elsize(buffers[i]) == 2 && !(ptr[i] = copy_of(task, buffers[i], i))) {
			copies_release(0);
			return rmoe_cl_fail(op, "no memory for an fp32 copy of buffer %d (%s, %lld bf16 elements)", i,
			                    spec[i].what, (long long)nx);
		}
	}
	return 0;
}

void rmoe_to_elements(const float *src, void *dst, int64_t n, size_t elsize)
{
	if (elsize == 2)
		rmoe_kernel_to_bf16(n, src, dst);
	else
		memcpy(dst, src, (size_t)n * sizeof(float));
}

void rmoe_from_elements(const void *src, float *dst, int64_t n, size_t elsize)
{
	if (elsize == 2)
		rmoe_kernel_from_bf16(n, src, dst);
	else
		memcpy(dst, src, (size_t)n * sizeof(float));
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

/* ---- submission ------------------------------------------------------------------- */

/* Colours of the operations in a trace, one per operation whatever the hop.
 * StarPU 1.3 passes each 0-255 component to Paje where 0-1 is expected, so
 * only components 0 and 0xff show as meant. Matched on the name's start:
 * "gather" covers "gather-dy", "accumulate" "accumulate-dg", "zero" every
 * zeroing. */
static const struct {
	const char *op;
	int colour;
} op_colours[] = {
	{"gather", 0x00ffff},      {"expert-ffn", 0xff0000}, {"scatter-add", 0xffff00},
	{"recompute", 0xff00ff},   {"expert-bwd", 0x0000ff}, {"grad-accumulate", 0x00ff00},
	{"accumulate", 0x00ff00},  {"zero", 0xffffff},
};

static int colour(const char *name)
{
	for (size_t i = 0; name && i < sizeof(op_colours) / sizeof(op_colours[0]); i++)
		if (strncmp(name, op_colours[i].op, strlen(op_colours[i].op)) == 0)
			return op_colours[i].colour;
	return 0; /* StarPU's own */
}

static int clamp_prio(int prio)
{
	int lo = starpu_sched_get_min_priority(), hi = starpu_sched_get_max_priority();
	return prio < lo ? lo : prio > hi ? hi : prio;
}

void *rmoe_cl_args_dup(const void *args, size_t size)
{
	void *a = malloc(size);
	if (a)
		memcpy(a, args, size);
	return a;
}

int rmoe_cl_insert(const struct rmoe_task_opts *o, struct starpu_codelet *cl, struct starpu_data_descr *d, int nd,
                   void *args, size_t argsize, double flops)
{
	if (!args && argsize > 0)
		return rmoe_error(RMOE_ENOMEM, "out of host memory for a %s task", cl->name);
	struct starpu_task *t =
		starpu_task_build(cl, STARPU_DATA_MODE_ARRAY, d, nd, STARPU_CL_ARGS, args, argsize, STARPU_PRIORITY,
		                  clamp_prio(o->prio), STARPU_NAME, o->name, STARPU_TASK_COLOR, colour(o->name), 0);
	if (!t) {
		free(args);
		return rmoe_error(RMOE_ESTARPU, "building a %s task failed", cl->name);
	}
	if (flops > 0)
		t->flops = flops;
	if (o->after)
		starpu_task_declare_deps_array(t, 1, (struct starpu_task **)&o->after);
	if (o->kept)
		t->destroy = 0;
	int ret = starpu_task_submit(t);
	if (ret) {
		starpu_task_destroy(t);
		if (ret == -ENODEV)
			return rmoe_error(RMOE_ESTARPU, "no StarPU worker can run the %s codelet", cl->name);
		return rmoe_error(RMOE_ESTARPU, "submitting a %s task failed (%d)", cl->name, ret);
	}
	if (o->kept)
		*o->kept = t;
	return 0;
}

/* ---- sizes and flops ------------------------------------------------------------------- */

size_t rmoe_expert_args_size(int64_t n_experts)
{
	if (n_experts < 0)
		n_experts = 0;
	return sizeof(struct rmoe_expert_args) + (size_t)n_experts * sizeof(int64_t);
}

struct rmoe_expert_args *rmoe_expert_args_from(const struct rmoe_expert_shape *s)
{
	struct rmoe_expert_args *a = calloc(1, rmoe_expert_args_size(s->n_experts));
	if (!a)
		return NULL;
	a->hidden = s->hidden;
	a->ffn = s->ffn;
	a->n_experts = s->n_experts;
	a->rows = s->rows;
	memcpy(a->rows_per_expert, s->rows_per_expert, (size_t)s->n_experts * sizeof(int64_t));
	return a;
}

size_t rmoe_sort_args_size(int64_t n_peers, int64_t n_experts)
{
	if (n_peers < 0 || n_experts < 0)
		n_peers = n_experts = 0;
	return sizeof(struct rmoe_sort_args) + (size_t)n_peers * (size_t)n_experts * sizeof(int64_t);
}

static double flops_gemm(int64_t m, int64_t n, int64_t k)
{
	return 2.0 * (double)m * (double)n * (double)k;
}

/* gate and up projections, and the down projection unless recomputing (§3.3
 * reconstruction stops at the SwiGLU output). */
double rmoe_flops_expert_ffn(int64_t rows, int64_t hidden, int64_t ffn, int with_down)
{
	return (with_down ? 3.0 : 2.0) * flops_gemm(rows, hidden, ffn);
}

/* Both modes: six GEMMs of the forward's size (pair-weighted: u, dw_down,
 * dw_gate, dw_up, dx twice; preweighted: dact instead of u). */
double rmoe_flops_expert_bwd(int64_t rows, int64_t hidden, int64_t ffn)
{
	return 6.0 * flops_gemm(rows, hidden, ffn);
}

/* The logits GEMM of the forward; the backward runs two GEMMs of this size
 * (dw_router and dx). */
double rmoe_flops_router(int64_t tokens, int64_t hidden, int64_t experts)
{
	return flops_gemm(tokens, hidden, experts);
}
