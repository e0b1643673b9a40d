/* Expert kernels (CPU): SwiGLU FFN over one partition's rows, grouped by
 * expert (one GEMM per expert and matrix: no padding, no [T*K] buffer), its
 * §3.3 recompute, and the two backward modes. */
#include <string.h>

#include <cblas.h>

#include "rmoe_kernels.h"

#ifdef RMOE_HAVE_VECTOR_EXPF
/* glibc's libmvec has expf for 4, 8 and 16 floats (_ZGV*_expf); math.h
 * declares them only under -ffast-math, which the kernels must not take
 * (NaN and infinity checks, the order of sums). Declared here, the SwiGLU
 * loops below call them instead of one scalar expf per element. */
__attribute__((__simd__("notinbranch"))) float expf(float);
#endif

/* SwiGLU forward: act = silu(gate) * up over n elements. `omp simd`
 * (-fopenmp-simd, codelets/CMakeLists.txt): the buffers never overlap, and
 * the loop vectorises at the build's -O2 too. */
static void swiglu_fwd(const float *gate, const float *up, float *act, int64_t n)
{
#pragma omp simd
	for (int64_t i = 0; i < n; i++)
		act[i] = rmoe_swiglu(gate[i], up[i]);
}

void rmoe_kernel_expert_ffn(int64_t H, int64_t F, int64_t ne, const int64_t *rows_per_expert, int64_t m,
                            const float *x, const float *w, float *work, float *out)
{
	float *gate = work, *up = work + m * F, *act = work + 2 * m * F;
	int64_t o = 0;
	for (int64_t e = 0; e < ne; o += rows_per_expert[e], e++) {
		const int64_t r = rows_per_expert[e];
		if (r == 0)
			continue;
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)r, (int)F, (int)H, 1.0f, x + o * H,
		            (int)H, w + rmoe_w_gate_offset(ne, H, F, e), (int)F, 0.0f, gate + o * F, (int)F);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)r, (int)F, (int)H, 1.0f, x + o * H,
		            (int)H, w + rmoe_w_up_offset(ne, H, F, e), (int)F, 0.0f, up + o * F, (int)F);
		swiglu_fwd(gate + o * F, up + o * F, act + o * F, r * F);
		if (out)
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)r, (int)H, (int)F, 1.0f,
			            act + o * F, (int)F, w + rmoe_w_down_offset(ne, H, F, e), (int)H, 0.0f,
			            out + o * H, (int)H);
	}
}

/* SwiGLU backward in place: gate/up pre-activations in, dpre_gate/dpre_up
 * out, from dact; each element is read before it is written, and dact is
 * a third buffer, so `omp simd` holds as for swiglu_fwd. */
static void swiglu_bwd(float *gate, float *up, const float *dact, int64_t n)
{
#pragma omp simd
	for (int64_t i = 0; i < n; i++) {
		float dgate, dup;
		rmoe_swiglu_bwd(gate[i], up[i], dact[i], &dgate, &dup);
		gate[i] = dgate;
		up[i] = dup;
	}
}

/* The GEMMs after dpre: dw_gate/up = x^T dpre, dx = dpre_gate w_gate^T +
 * dpre_up w_up^T, for r rows of one expert. */
static void bwd_tail(int64_t r, int64_t H, int64_t F, const float *x, const float *dpre_gate,
                     const float *dpre_up, const float *w_gate, const float *w_up, float *dw_gate,
                     float *dw_up, float *dx, float beta)
{
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H, (int)F, (int)r, 1.0f, x, (int)H, dpre_gate,
	            (int)F, beta, dw_gate, (int)F);
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)H, (int)F, (int)r, 1.0f, x, (int)H, dpre_up,
	            (int)F, beta, dw_up, (int)F);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)r, (int)H, (int)F, 1.0f, dpre_gate, (int)F,
	            w_gate, (int)F, 0.0f, dx, (int)H);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)r, (int)H, (int)F, 1.0f, dpre_up, (int)F,
	            w_up, (int)F, 1.0f, dx, (int)H);
}

/* An expert with no rows has nothing to compute; its gradient is zero
 * unless the task adds to an earlier one. */
static int expert_without_rows(int64_t r, int accumulate, float *dw, int64_t ne, int64_t H, int64_t F, int64_t e)
{
	if (r != 0)
		return 0;
	size_t bytes = (size_t)(H * F) * sizeof(float);
	if (!accumulate) {
		memset(dw + rmoe_w_gate_offset(ne, H, F, e), 0, bytes);
		memset(dw + rmoe_w_up_offset(ne, H, F, e), 0, bytes);
		memset(dw + rmoe_w_down_offset(ne, H, F, e), 0, bytes);
	}
	return 1;
}

/* Accumulated in double: dg sums F terms of mixed signs. */
static double dot(const float *a, const float *b, int64_t n)
{
	double s = 0.0;
	for (int64_t i = 0; i < n; i++)
		s += (double)a[i] * (double)b[i];
	return s;
}

void rmoe_kernel_expert_bwd_pairs(int64_t H, int64_t F, int64_t ne, const int64_t *rows_per_expert, int64_t m,
                                  int64_t first, int64_t K, int accumulate, float *x, const float *dy,
                                  const float *w, const int32_t *pair_order, const float *topk_w, float *work,
                                  float *dx, float *dg, float *dw)
{
	float *gate = work, *up = work + m * F, *act = work + 2 * m * F, *u = work + 3 * m * F;
	const float beta = accumulate ? 1.0f : 0.0f;
	int64_t o = 0;
	for (int64_t e = 0; e < ne; o += rows_per_expert[e], e++) {
		const int64_t r = rows_per_expert[e];
		if (expert_without_rows(r, accumulate, dw, ne, H, F, e))
			continue;
		float *xe = x + o * H;
		const float *dye = dy + o * H;
		float *ue = u + o * F, *acte = act + o * F;
		const float *w_down = w + rmoe_w_down_offset(ne, H, F, e);

		/* u = dy w_down^T: dL/dg of a pair is <dy, act w_down> = <u, act>. */
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)r, (int)F, (int)H, 1.0f, dye, (int)H,
		            w_down, (int)H, 0.0f, ue, (int)F);
		for (int64_t i = 0; i < r; i++) {
			int64_t p = pair_order[first + o + i];
			float g = topk_w[p];
			float *ui = ue + i * F, *acti = acte + i * F;
			dg[p] = (float)dot(ui, acti, F);
			for (int64_t j = 0; j < F; j++) {
				acti[j] *= g;
				ui[j] *= g;
			}
		}
		/* dw_down = (g*act)^T dy; then u holds dact = g*u. */
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)F, (int)H, (int)r, 1.0f, acte, (int)F,
		            dye, (int)H, beta, dw + rmoe_w_down_offset(ne, H, F, e), (int)H);
		swiglu_bwd(gate + o * F, up + o * F, ue, r * F);
		/* The tail reads x for the weight gradients before it writes the
		 * rows' dx over them: no separate dx rows buffer per hop. */
		bwd_tail(r, H, F, xe, gate + o * F, up + o * F, w + rmoe_w_gate_offset(ne, H, F, e),
		         w + rmoe_w_up_offset(ne, H, F, e), dw + rmoe_w_gate_offset(ne, H, F, e),
		         dw + rmoe_w_up_offset(ne, H, F, e), xe, beta);
	}
	/* Without dx (the lean all-to-all) the rows' dx stay in x. */
	for (int64_t i = 0; dx && i < m; i++)
		cblas_saxpy((int)H, 1.0f, x + i * H, 1, dx + (int64_t)pair_order[first + i] / K * H, 1);
}

void rmoe_kernel_expert_bwd_preweighted(int64_t H, int64_t F, int64_t ne, const int64_t *rows_per_expert,
                                        int64_t m, int accumulate, const float *x, const float *dout,
                                        const float *w, float *work, float *dx, float *dw)
{
	float *gate = work, *up = work + m * F, *act = work + 2 * m * F;
	const float beta = accumulate ? 1.0f : 0.0f;
	int64_t o = 0;
	for (int64_t e = 0; e < ne; o += rows_per_expert[e], e++) {
		const int64_t r = rows_per_expert[e];
		if (expert_without_rows(r, accumulate, dw, ne, H, F, e))
			continue;
		const float *xe = x + o * H, *doute = dout + o * H;
		float *acte = act + o * F;
		/* dw_down = act^T dout reads act before dact takes its place. */
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)F, (int)H, (int)r, 1.0f, acte, (int)F,
		            doute, (int)H, beta, dw + rmoe_w_down_offset(ne, H, F, e), (int)H);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)r, (int)F, (int)H, 1.0f, doute, (int)H,
		            w + rmoe_w_down_offset(ne, H, F, e), (int)H, 0.0f, acte, (int)F);
		swiglu_bwd(gate + o * F, up + o * F, acte, r * F);
		bwd_tail(r, H, F, xe, gate + o * F, up + o * F, w + rmoe_w_gate_offset(ne, H, F, e),
		         w + rmoe_w_up_offset(ne, H, F, e), dw + rmoe_w_gate_offset(ne, H, F, e),
		         dw + rmoe_w_up_offset(ne, H, F, e), dx + o * H, beta);
	}
}
