/* Per-element maths of the kernels, written once for the CPU loops and the
 * CUDA kernels: RMOE_HD marks them __host__ __device__ under nvcc and is
 * empty for the C compiler, so the CPU tests cover the same expressions the
 * GPU runs. Plain C: no StarPU, no BLAS. */
#ifndef RMOE_KERNEL_MATH_H
#define RMOE_KERNEL_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define RMOE_HD __host__ __device__
#else
#define RMOE_HD
#endif

/* Sigmoid without overflow of expf for large |g|. */
static inline RMOE_HD float rmoe_sigmoid(float g)
{
	if (g >= 0.0f)
		return 1.0f / (1.0f + expf(-g));
	float z = expf(g);
	return z / (1.0f + z);
}

static inline RMOE_HD float rmoe_silu(float g)
{
	return g * rmoe_sigmoid(g);
}

/* SwiGLU forward of one element: act = silu(gate) * up. */
static inline RMOE_HD float rmoe_swiglu(float gate, float up)
{
	return rmoe_silu(gate) * up;
}

/* SwiGLU backward of one element, from dact: the gradients of the gate and
 * up pre-activations. silu'(g) = s*(1 + g*(1 - s)). */
static inline RMOE_HD void rmoe_swiglu_bwd(float gate, float up, float dact, float *dgate, float *dup)
{
	float s = rmoe_sigmoid(gate);
	*dup = dact * gate * s;
	*dgate = dact * up * s * (1.0f + gate * (1.0f - s));
}

/* bf16: the upper half of an IEEE binary32, rounded to nearest even (NaN
 * stays a quiet NaN). Storage only: every kernel computes in fp32. */
static inline RMOE_HD uint16_t rmoe_bf16_from_float(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

static inline RMOE_HD float rmoe_float_from_bf16(uint16_t b)
{
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* Partition weights: gate [ne][H][F] | up [ne][H][F] | down [ne][F][H]. */
static inline RMOE_HD int64_t rmoe_partition_weights_count(int64_t n_experts, int64_t hidden, int64_t ffn)
{
	return 3 * n_experts * hidden * ffn;
}

static inline RMOE_HD int64_t rmoe_w_gate_offset(int64_t n_experts, int64_t hidden, int64_t ffn, int64_t e)
{
	(void)n_experts;
	return e * hidden * ffn;
}

static inline RMOE_HD int64_t rmoe_w_up_offset(int64_t n_experts, int64_t hidden, int64_t ffn, int64_t e)
{
	return (n_experts + e) * hidden * ffn;
}

static inline RMOE_HD int64_t rmoe_w_down_offset(int64_t n_experts, int64_t hidden, int64_t ffn, int64_t e)
{
	return (2 * n_experts + e) * hidden * ffn;
}

#endif /* RMOE_KERNEL_MATH_H */
