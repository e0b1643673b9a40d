/* Set-up of the kernels' environment, argument sizes and flop counts. */
#include <stdatomic.h>

#include <cblas.h>

#include "kernels.h"
#include "rmoe_codelets.h"
#include "rmoe_config.h"

static atomic_flag rmoe_codelets_initialised = ATOMIC_FLAG_INIT;

void rmoe_codelets_init(void)
{
	if (atomic_flag_test_and_set(&rmoe_codelets_initialised))
		return;
#ifdef RMOE_HAVE_OPENBLAS_SET_NUM_THREADS
	/* StarPU runs one worker per core: a BLAS call inside a task must not
	 * start threads of its own on the cores of the other workers. */
	openblas_set_num_threads(1);
#endif
	rmoe_sim_cost_init();
}

size_t rmoe_expert_args_size(int64_t n_experts)
{
	if (n_experts < 0)
		n_experts = 0;
	return sizeof(struct rmoe_expert_args) + (size_t)n_experts * sizeof(int64_t);
}

size_t rmoe_sort_args_size(int64_t n_peers, int64_t n_experts)
{
	if (n_peers < 0 || n_experts < 0)
		n_peers = n_experts = 0;
	return sizeof(struct rmoe_sort_args) + (size_t)n_peers * (size_t)n_experts * sizeof(int64_t);
}

static double rmoe_flops_gemm(int64_t m, int64_t n, int64_t k)
{
	return 2.0 * (double)m * (double)n * (double)k;
}

/* gate and up projections, and the down projection unless recomputing (§3.3
 * reconstruction stops at the SwiGLU output). */
double rmoe_flops_expert_ffn(int64_t rows, int64_t hidden, int64_t ffn, int with_down)
{
	return (with_down ? 3.0 : 2.0) * rmoe_flops_gemm(rows, hidden, ffn);
}

/* Pair-weighted: u, dw_down, dw_gate, dw_up, dx (two GEMMs).
 * Preweighted: dact, dw_down, dw_gate, dw_up, dx (two GEMMs). */
double rmoe_flops_expert_bwd(int64_t rows, int64_t hidden, int64_t ffn, int mode)
{
	(void)mode;
	return 6.0 * rmoe_flops_gemm(rows, hidden, ffn);
}

/* The logits GEMM of the forward; the backward runs two GEMMs of this size
 * (dw_router and dx). */
double rmoe_flops_router(int64_t tokens, int64_t hidden, int64_t experts)
{
	return rmoe_flops_gemm(tokens, hidden, experts);
}
