/* CUDA kernels of the experts over one partition: each matrix of the
 * expert FFN one cuBLAS call for all the partition's experts (cuda_gemm.cuh:
 * a grouped GEMM by default, fp32 accumulation whatever the storage type),
 * elementwise kernels over all the partition's rows at once, in the phases
 * of the CPU kernels (rmoe_kernels.h).
 *
 * Fusion within what the weight layout allows. An expert's gate and up
 * matrices are gate [ne][H][F] | up [ne][H][F] (rmoe_w_gate_offset,
 * rmoe_w_up_offset): ne*H*F elements apart, not side by side in each row,
 * so no single [H][2F] operand holds both, and the workspace keeps the
 * gate and up pre-activations in blocks m*F apart. Gate and up are
 * therefore one call with two problems per expert (both strides constant),
 * not one GEMM with N = 2F; the same holds for the weight gradients. The
 * dx GEMMs (dgate w_gate^T + dup w_up^T, one K = 2F GEMM if each row held
 * [gate | up]) stay two calls, the second adding to the first. */
#include "cuda_gemm.cuh"

/* The way the expert launchers take, one for the process: the launchers of
 * every worker read it, the runtime sets it before any task runs. */
static int gemm_way = RMOE_HAVE_GROUPED_GEMM ? RMOE_GEMM_GROUPED : RMOE_GEMM_STRIDED;

extern "C" int rmoe_cuda_gemm_select(const char *name)
{
	const int dflt = RMOE_HAVE_GROUPED_GEMM ? RMOE_GEMM_GROUPED : RMOE_GEMM_STRIDED;
	gemm_way = dflt;
	if (!name || !*name)
		return 0;
	for (int w = 0; w < RMOE_GEMM_WAYS; w++)
		if (!strcmp(name, rmoe_gemm_way_name(w))) {
			gemm_way = w == RMOE_GEMM_GROUPED && !RMOE_HAVE_GROUPED_GEMM ? dflt : w;
			return 0;
		}
	return -1;
}

extern "C" int rmoe_cuda_gemm_way(void)
{
	return gemm_way;
}

extern "C" const char *rmoe_cuda_gemm_name(void)
{
	return rmoe_gemm_way_name(gemm_way);
}

/* act = silu(gate) * up over n elements, V at a time. */
template <typename T, int V>
__global__ void swiglu_k(rmoe_width<V>, int64_t n, const T *__restrict__ gate, const T *__restrict__ up,
                         T *__restrict__ act)
{
	for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * V; i < n;
	     i += (int64_t)gridDim.x * blockDim.x * V) {
		float g[V], u[V];
		rmoe_io<T, V>::ld(gate + i, g);
		rmoe_io<T, V>::ld(up + i, u);
		for (int q = 0; q < V; q++)
			g[q] = rmoe_swiglu(g[q], u[q]);
		rmoe_io<T, V>::st(act + i, g);
	}
}

/* SwiGLU backward in place: gate and up pre-activations become their
 * gradients, from dact. */
template <typename T, int V>
__global__ void swiglu_bwd_k(rmoe_width<V>, int64_t n, T *__restrict__ gate, T *__restrict__ up,
                             const T *__restrict__ dact)
{
	for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * V; i < n;
	     i += (int64_t)gridDim.x * blockDim.x * V) {
		float g[V], u[V], d[V];
		rmoe_io<T, V>::ld(gate + i, g);
		rmoe_io<T, V>::ld(up + i, u);
		rmoe_io<T, V>::ld(dact + i, d);
		for (int q = 0; q < V; q++)
			rmoe_swiglu_bwd(g[q], u[q], d[q], &g[q], &u[q]);
		rmoe_io<T, V>::st(gate + i, g);
		rmoe_io<T, V>::st(up + i, u);
	}
}

/* The pair weights fused into SwiGLU's backward, a warp per row of the
 * slice: dg[p] = <u, act> (§3.3: the routing weight g applied in the
 * kernel, not to a copy of the rows), act and u scaled by g, and the gate
 * and up pre-activations replaced by their gradients from dact = g u, in
 * one pass over the four blocks of the row. */
template <typename T, int V>
__global__ void pair_swiglu_bwd_k(rmoe_width<V>, int64_t m, int64_t F, int64_t first,
                                  const int32_t *__restrict__ order, const float *__restrict__ topk_w,
                                  T *__restrict__ gate, T *__restrict__ up, T *__restrict__ act, T *__restrict__ u,
                                  float *__restrict__ dg)
{
	for (int64_t i = rmoe_warp_id(); i < m; i += rmoe_warps()) {
		const int64_t p = order[first + i];
		const float g = topk_w[p];
		float acc = 0.0f;
		for (int64_t j = i * F + rmoe_lane() * V; j < (i + 1) * F; j += RMOE_WARP * V) {
			float a[V], du[V], gt[V], upv[V];
			rmoe_io<T, V>::ld(act + j, a);
			rmoe_io<T, V>::ld(u + j, du);
			rmoe_io<T, V>::ld(gate + j, gt);
			rmoe_io<T, V>::ld(up + j, upv);
			for (int q = 0; q < V; q++) {
				acc += du[q] * a[q];
				a[q] *= g;
				du[q] *= g;
				rmoe_swiglu_bwd(gt[q], upv[q], du[q], &gt[q], &upv[q]);
			}
			rmoe_io<T, V>::st(act + j, a);
			rmoe_io<T, V>::st(u + j, du);
			rmoe_io<T, V>::st(gate + j, gt);
			rmoe_io<T, V>::st(up + j, upv);
		}
		acc = rmoe_warp_sum(acc);
		if (rmoe_lane() == 0)
			dg[p] = acc;
	}
}

/* An elementwise kernel over n elements of blocks at the pointers: 16
 * bytes a thread where n and the blocks' alignment allow. */
template <typename T> static inline bool elementwise_vec(int64_t n, std::initializer_list<const void *> ptrs)
{
	return rmoe_vec_ok<T>(n, ptrs);
}
static inline unsigned elementwise_blocks(int64_t n, int V)
{
	return rmoe_cuda_blocks((n + V - 1) / V);
}

template <typename T> static int swiglu(cudaStream_t s, int64_t n, const T *gate, const T *up, T *act)
{
	constexpr int V = rmoe_vec<T>::n;
	if (elementwise_vec<T>(n, {gate, up, act}))
		RMOE_LAUNCH(swiglu_k, elementwise_blocks(n, V), RMOE_CUDA_THREADS, 0, s, rmoe_width<V>(), n, gate, up, act);
	else
		RMOE_LAUNCH(swiglu_k, rmoe_cuda_blocks(n), RMOE_CUDA_THREADS, 0, s, rmoe_width<1>(), n, gate, up, act);
	return rmoe_cuda_check("swiglu");
}

template <typename T> static int swiglu_bwd(cudaStream_t s, int64_t n, T *gate, T *up, const T *dact)
{
	constexpr int V = rmoe_vec<T>::n;
	if (elementwise_vec<T>(n, {gate, up, dact}))
		RMOE_LAUNCH(swiglu_bwd_k, elementwise_blocks(n, V), RMOE_CUDA_THREADS, 0, s, rmoe_width<V>(), n, gate, up,
		            dact);
	else
		RMOE_LAUNCH(swiglu_bwd_k, rmoe_cuda_blocks(n), RMOE_CUDA_THREADS, 0, s, rmoe_width<1>(), n, gate, up, dact);
	return rmoe_cuda_check("swiglu backward");
}

/* A partition's weights (or their gradients) as operands: one matrix of
 * the gate, up (gate's second problem) or down block per expert, from the
 * layout's offset functions (rmoe_kernel_math.h). */
enum which_w { W_GATE_UP, W_UP, W_DOWN };
static inline struct rmoe_xop weights_op(const void *w, size_t es, int64_t ne, int64_t H, int64_t F, enum which_w k)
{
	const int64_t o0 = k == W_DOWN ? rmoe_w_down_offset(ne, H, F, 0)
	                   : k == W_UP ? rmoe_w_up_offset(ne, H, F, 0)
	                               : rmoe_w_gate_offset(ne, H, F, 0);
	const int64_t o1 = k == W_DOWN ? rmoe_w_down_offset(ne, H, F, 1)
	                   : k == W_UP ? rmoe_w_up_offset(ne, H, F, 1)
	                               : rmoe_w_gate_offset(ne, H, F, 1);
	const int64_t up = rmoe_w_up_offset(ne, H, F, 0) - rmoe_w_gate_offset(ne, H, F, 0);
	struct rmoe_xop o = {(const char *)w + es * (size_t)o0, 0, o1 - o0, k == W_GATE_UP ? up : 0,
	                     k == W_DOWN ? H : F};
	return o;
}

/* Rows of the partition: ld elements each, problems (gate, up blocks of
 * the workspace) problem elements apart. */
static inline struct rmoe_xop rows_op(const void *p, int64_t ld, int64_t problem)
{
	struct rmoe_xop o = {p, ld, 0, problem, ld};
	return o;
}

/* The tail shared by both backward modes: dw_gate, dw_up = x^T dpre (one
 * call, two problems per expert), then the rows' dx = dpre_gate w_gate^T +
 * dpre_up w_up^T (the weight-gradient GEMMs are enqueued first: dx may
 * overwrite x). */
static inline void bwd_tail_calls(struct rmoe_xgemm *g, const void *x, const void *w, const void *work, void *dx,
                                  void *dw, size_t es, int64_t ne, int64_t H, int64_t F, int64_t m, float beta)
{
	const char *gate = (const char *)work, *up = gate + es * (size_t)(m * F);
	g[0] = {1, 0, 'k', H, F, 0, 2, 1.0f, beta, rows_op(x, H, 0), rows_op(gate, F, m * F),
	        weights_op(dw, es, ne, H, F, W_GATE_UP)};
	g[1] = {0, 1, 'm', 0, H, F, 1, 1.0f, 0.0f, rows_op(gate, F, 0), weights_op(w, es, ne, H, F, W_GATE_UP),
	        rows_op(dx, H, 0)};
	g[2] = {0, 1, 'm', 0, H, F, 1, 1.0f, 1.0f, rows_op(up, F, 0), weights_op(w, es, ne, H, F, W_UP),
	        rows_op(dx, H, 0)};
}

/* An expert without rows gets a zero gradient unless the task adds to an
 * earlier one: the grouped and loop ways leave such experts out of their
 * calls (the strided way's zero rows would give the same zeros). With more
 * than one such expert the whole partition's gradient (gate, up and down
 * blocks, contiguous) is zeroed in one call and the GEMMs overwrite the
 * experts with rows: a chunk's first task on few rows once made a memset
 * per matrix of nearly every expert, hundreds a step. */
template <typename T>
static int zero_empty(cudaStream_t s, int64_t H, int64_t F, int64_t ne, const int64_t *rpe, T *dw, float beta)
{
	int64_t empty = 0;
	for (int64_t e = 0; e < ne && beta == 0.0f; e++)
		empty += rpe[e] == 0;
	if (empty > 1)
		return rmoe_cuda_ok(cudaMemsetAsync(dw, 0, (size_t)(3 * ne * H * F) * sizeof(T), s), "memset");
	int rc = 0;
	for (int64_t e = 0; e < ne && !rc && empty; e++)
		for (int k = 0; rpe[e] == 0 && k < 3 && !rc; k++)
			rc = rmoe_cuda_ok(cudaMemsetAsync(dw + (k == 0   ? rmoe_w_gate_offset(ne, H, F, e)
			                                        : k == 1 ? rmoe_w_up_offset(ne, H, F, e)
			                                                 : rmoe_w_down_offset(ne, H, F, e)),
			                                  0, (size_t)(H * F) * sizeof(T), s),
			                  "memset");
	return rc;
}

/* Problems per expert of each launcher's calls: what the grouped way's
 * pointer arrays hold. */
#define FFN_PROBLEMS 3
#define BWD_PROBLEMS 6

template <typename T>
static int expert_ffn(cudaStream_t s, cublasHandle_t b, int64_t H, int64_t F, int64_t ne, const int64_t *rpe,
                      int64_t m, const T *x, const T *w, T *work, T *out, struct rmoe_arena *a)
{
	const size_t es = sizeof(T);
	T *gate = work, *up = work + m * F, *act = work + 2 * m * F;
	/* Gate and up: one call, two problems per expert. */
	const struct rmoe_xgemm g[2] = {
		{0, 0, 'm', 0, F, H, 2, 1.0f, 0.0f, rows_op(x, H, 0), weights_op(w, es, ne, H, F, W_GATE_UP),
		 rows_op(gate, F, m * F)},
		{0, 0, 'm', 0, H, F, 1, 1.0f, 0.0f, rows_op(act, F, 0), weights_op(w, es, ne, H, F, W_DOWN),
		 rows_op(out, H, 0)},
	};
	struct rmoe_xplan p;
	int rc = rmoe_xplan_start(&p, s, b, a, rmoe_cuda_type<T>::id, es, ne, rpe, g, out ? 2 : 1);
	if (!rc)
		rc = rmoe_xplan_run(&p, 0);
	if (!rc && m > 0)
		rc = swiglu(s, m * F, gate, up, act);
	if (!rc && out)
		rc = rmoe_xplan_run(&p, 1);
	rmoe_xplan_end(&p);
	return rc;
}

template <typename T>
static int expert_bwd_pairs(cudaStream_t s, cublasHandle_t b, int64_t H, int64_t F, int64_t ne, const int64_t *rpe,
                            int64_t m, int64_t n_pairs, int64_t first, int64_t K, int accumulate, T *x, const T *dy,
                            const T *w, const int32_t *order, const float *topk_w, T *work, T *dx, float *dg, T *dw,
                            int32_t *index, struct rmoe_arena *a)
{
	const size_t es = sizeof(T);
	const float beta = accumulate ? 1.0f : 0.0f;
	T *gate = work, *up = work + m * F, *act = work + 2 * m * F, *u = work + 3 * m * F;
	struct rmoe_xgemm g[5] = {
		/* u = dy w_down^T: dL/dg of a pair is <u, act>. */
		{0, 1, 'm', 0, F, H, 1, 1.0f, 0.0f, rows_op(dy, H, 0), weights_op(w, es, ne, H, F, W_DOWN), rows_op(u, F, 0)},
		/* dw_down = (g act)^T dy. */
		{1, 0, 'k', F, H, 0, 1, 1.0f, beta, rows_op(act, F, 0), rows_op(dy, H, 0),
		 weights_op(dw, es, ne, H, F, W_DOWN)},
	};
	/* The rows' dx over the consumed x rows. */
	bwd_tail_calls(g + 2, x, w, work, x, dw, es, ne, H, F, m, beta);
	struct rmoe_xplan p;
	int rc = zero_empty(s, H, F, ne, rpe, dw, beta);
	if (!rc)
		rc = rmoe_xplan_start(&p, s, b, a, rmoe_cuda_type<T>::id, es, ne, rpe, g, 5);
	if (!rc)
		rc = rmoe_xplan_run(&p, 0);
	if (!rc && m > 0) {
		constexpr int V = rmoe_vec<T>::n;
		if (rmoe_vec_ok<T>(F, {gate, up, act, u}))
			RMOE_LAUNCH(pair_swiglu_bwd_k, rmoe_cuda_warp_rows(m), RMOE_CUDA_THREADS, 0, s, rmoe_width<V>(), m, F,
			            first, order, topk_w, gate, up, act, u, dg);
		else
			RMOE_LAUNCH(pair_swiglu_bwd_k, rmoe_cuda_warp_rows(m), RMOE_CUDA_THREADS, 0, s, rmoe_width<1>(), m, F,
			            first, order, topk_w, gate, up, act, u, dg);
		rc = rmoe_cuda_check("pair weights and swiglu backward");
	}
	for (int i = 1; i < 5 && !rc; i++)
		rc = rmoe_xplan_run(&p, i);
	rmoe_xplan_end(&p);
	/* Added at their tokens (without dx, the lean all-to-all's, they stay
	 * in x) as the scatter-add adds. */
	if (!rc && m > 0 && dx)
		rc = rmoe_cuda_rows_add(s, rmoe_cuda_type<T>::id == CUDA_R_16BF, H, K, n_pairs, first, m, x, order, NULL, dx,
		                        index);
	return rc;
}

template <typename T>
static int expert_bwd_preweighted(cudaStream_t s, cublasHandle_t b, int64_t H, int64_t F, int64_t ne,
                                  const int64_t *rpe, int64_t m, int accumulate, const T *x, const T *dout,
                                  const T *w, T *work, T *dx, T *dw, struct rmoe_arena *a)
{
	const size_t es = sizeof(T);
	const float beta = accumulate ? 1.0f : 0.0f;
	T *gate = work, *up = work + m * F, *act = work + 2 * m * F;
	struct rmoe_xgemm g[5] = {
		/* dw_down = act^T dout reads act before dact = dout w_down^T
		 * replaces it. */
		{1, 0, 'k', F, H, 0, 1, 1.0f, beta, rows_op(act, F, 0), rows_op(dout, H, 0),
		 weights_op(dw, es, ne, H, F, W_DOWN)},
		{0, 1, 'm', 0, F, H, 1, 1.0f, 0.0f, rows_op(dout, H, 0), weights_op(w, es, ne, H, F, W_DOWN),
		 rows_op(act, F, 0)},
	};
	bwd_tail_calls(g + 2, x, w, work, dx, dw, es, ne, H, F, m, beta);
	struct rmoe_xplan p;
	int rc = zero_empty(s, H, F, ne, rpe, dw, beta);
	if (!rc)
		rc = rmoe_xplan_start(&p, s, b, a, rmoe_cuda_type<T>::id, es, ne, rpe, g, 5);
	for (int i = 0; i < 2 && !rc; i++)
		rc = rmoe_xplan_run(&p, i);
	if (!rc && m > 0)
		rc = swiglu_bwd(s, m * F, gate, up, (const T *)act);
	for (int i = 2; i < 5 && !rc; i++)
		rc = rmoe_xplan_run(&p, i);
	rmoe_xplan_end(&p);
	return rc;
}

extern "C" size_t rmoe_cuda_expert_ffn_scratch(int64_t n_experts)
{
	return rmoe_xgemm_ptr_bytes(n_experts, FFN_PROBLEMS);
}

extern "C" size_t rmoe_cuda_expert_bwd_scratch(int deterministic, int64_t n_pairs, int64_t n_experts)
{
	const size_t index = rmoe_cuda_rows_add_scratch(deterministic, n_pairs);
	return (index ? rmoe_arena_size(index) : 0) + rmoe_xgemm_ptr_bytes(n_experts, BWD_PROBLEMS);
}

extern "C" int rmoe_cuda_expert_ffn(cudaStream_t s, cublasHandle_t b, int bf16, int64_t H, int64_t F, int64_t ne,
                                    const int64_t *rpe, int64_t m, const void *x, const void *w, void *work,
                                    void *out)
{
	struct rmoe_cuda_scratch none = {NULL, 0};
	struct rmoe_arena a = rmoe_arena_of(none, s);
	const int rc = bf16 ? expert_ffn(s, b, H, F, ne, rpe, m, (const rmoe_bf16_t *)x, (const rmoe_bf16_t *)w,
	                                 (rmoe_bf16_t *)work, (rmoe_bf16_t *)out, &a)
	                    : expert_ffn(s, b, H, F, ne, rpe, m, (const float *)x, (const float *)w, (float *)work,
	                                 (float *)out, &a);
	const int released = rmoe_arena_release(&a);
	return rc ? rc : released;
}

extern "C" int rmoe_cuda_expert_bwd_pairs(cudaStream_t s, cublasHandle_t b, int bf16, int64_t H, int64_t F,
                                          int64_t ne, const int64_t *rpe, int64_t m, int64_t n_pairs, int64_t first,
                                          int64_t K, int accumulate, void *x, const void *dy, const void *w,
                                          const int32_t *order, const float *topk_w, void *work, void *dx,
                                          float *dg, void *dw, int deterministic, struct rmoe_cuda_scratch scratch)
{
	(void)deterministic;
	struct rmoe_arena a = rmoe_arena_of(scratch, s);
	int32_t *index = NULL;
	int rc = dx && m > 0 ? rmoe_arena_take(&a, (size_t)n_pairs * sizeof(int32_t), (void **)&index) : 0;
	if (!rc && bf16)
		rc = expert_bwd_pairs(s, b, H, F, ne, rpe, m, n_pairs, first, K, accumulate, (rmoe_bf16_t *)x,
		                      (const rmoe_bf16_t *)dy, (const rmoe_bf16_t *)w, order, topk_w, (rmoe_bf16_t *)work,
		                      (rmoe_bf16_t *)dx, dg, (rmoe_bf16_t *)dw, index, &a);
	else if (!rc)
		rc = expert_bwd_pairs(s, b, H, F, ne, rpe, m, n_pairs, first, K, accumulate, (float *)x, (const float *)dy,
		                      (const float *)w, order, topk_w, (float *)work, (float *)dx, dg, (float *)dw, index, &a);
	const int released = rmoe_arena_release(&a);
	return rc ? rc : released;
}

extern "C" int rmoe_cuda_expert_bwd_preweighted(cudaStream_t s, cublasHandle_t b, int bf16, int64_t H, int64_t F,
                                                int64_t ne, const int64_t *rpe, int64_t m, int accumulate,
                                                const void *x, const void *dout, const void *w, void *work,
                                                void *dx, void *dw)
{
	struct rmoe_cuda_scratch none = {NULL, 0};
	struct rmoe_arena a = rmoe_arena_of(none, s);
	const int rc = bf16 ? expert_bwd_preweighted(s, b, H, F, ne, rpe, m, accumulate, (const rmoe_bf16_t *)x,
	                                             (const rmoe_bf16_t *)dout, (const rmoe_bf16_t *)w,
	                                             (rmoe_bf16_t *)work, (rmoe_bf16_t *)dx, (rmoe_bf16_t *)dw, &a)
	                    : expert_bwd_preweighted(s, b, H, F, ne, rpe, m, accumulate, (const float *)x,
	                                             (const float *)dout, (const float *)w, (float *)work, (float *)dx,
	                                             (float *)dw, &a);
	const int released = rmoe_arena_release(&a);
	return rc ? rc : released;
}
