/* Flop counts of the operations, for STARPU_FLOPS, the simulation's cost
 * models and the benchmarks. */
#include "rmoe_codelets.h"

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
