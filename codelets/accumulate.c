/* Gradient accumulation (dst += src) and zeroing: the ring's partial weight
 * gradients (G_j += S) and the empty contribution of a partition. */
#include <string.h>

#include "kernels.h"
#include "rmoe_codelets.h"

static void rmoe_accumulate_cpu(void *buffers[], void *cl_arg)
{
	rmoe_probe_sample();
	const struct rmoe_accumulate_args *a = cl_arg;
	RMOE_CL_CHECK(a->count >= 0, "grad-accumulate: count %lld", (long long)a->count);
	RMOE_CL_CHECK_NX(buffers, 0, a->count, "src");
	RMOE_CL_CHECK_NX(buffers, 1, a->count, "dst");
	const float *src = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]);
	float *dst = (float *)STARPU_VECTOR_GET_PTR(buffers[1]);
	for (int64_t i = 0; i < a->count; i++)
		dst[i] += src[i];
}

static void rmoe_zero_cpu(void *buffers[], void *cl_arg)
{
	rmoe_probe_sample();
	const struct rmoe_accumulate_args *a = cl_arg;
	RMOE_CL_CHECK(a->count >= 0, "zero: count %lld", (long long)a->count);
	RMOE_CL_CHECK_NX(buffers, 0, a->count, "dst");
	memset((float *)STARPU_VECTOR_GET_PTR(buffers[0]), 0, (size_t)a->count * sizeof(float));
}

#ifdef STARPU_USE_CUDA
/* CUDA kernels of accumulate and zero: not written yet; the codelets run on CPUs. */
#endif

static struct starpu_perfmodel rmoe_model_accumulate = RMOE_PERFMODEL("rmoe_accumulate_v1", rmoe_sim_cost_accumulate);

static struct starpu_perfmodel rmoe_model_zero = RMOE_PERFMODEL("rmoe_zero_v1", rmoe_sim_cost_accumulate);

struct starpu_codelet rmoe_cl_accumulate = {
	.name = "grad-accumulate",
	.cpu_funcs = {rmoe_accumulate_cpu},
	.cpu_funcs_name = {"rmoe_accumulate_cpu"},
	RMOE_SIM_CUDA_FUNCS
	.nbuffers = 2,
	.modes = {STARPU_R, STARPU_RW},
	.model = &rmoe_model_accumulate,
};

struct starpu_codelet rmoe_cl_zero = {
	.name = "zero",
	.cpu_funcs = {rmoe_zero_cpu},
	.cpu_funcs_name = {"rmoe_zero_cpu"},
	RMOE_SIM_CUDA_FUNCS
	.nbuffers = 1,
	.modes = {STARPU_W},
	.model = &rmoe_model_zero,
};
