/* The gate of a gated shared expert (Qwen2-MoE's shared_expert_gate): its
 * output scaled per token by sigmoid(x w), and the backward through it. */
#include "codelet.h"

/* Forward buffers: 0 x, 1 w [H], 2 the shared output (scaled in place).
 * Backward: 0 x, 1 w, 2 dy, 3 the recomputed shared output (becomes the
 * gated dy), 4 dx (added to), 5 dw [H]; then the device scratch when the
 * task has one. */
static int shared_gate_unpack(const char *op, void *buffers[], const struct rmoe_shared_gate_args *a, int bwd,
                              void **p)
{
	if (!(rmoe_cl_dim_ok(a->tokens) && a->hidden >= 1 && rmoe_cl_dim_ok(a->hidden) && a->scratch >= 0))
		return rmoe_cl_fail(op, "bad shape T=%lld H=%lld", (long long)a->tokens, (long long)a->hidden);
	const int64_t TH = a->tokens * a->hidden;
	const struct rmoe_cl_buffer fwd[] = {RMOE_CL_BUF("x", TH), RMOE_CL_BUF("w_shared_expert_gate", a->hidden),
	                                     RMOE_CL_BUF("shared output", TH)};
	const struct rmoe_cl_buffer back[] = {
		RMOE_CL_BUF("x", TH),  RMOE_CL_BUF("w_shared_expert_gate", a->hidden), RMOE_CL_BUF("dy", TH),
		RMOE_CL_BUF("shared output", TH), RMOE_CL_BUF("dx", TH), RMOE_CL_BUF("dw_shared_expert_gate", a->hidden),
		RMOE_CL_BUF("scratch", a->scratch)};
	return bwd ? rmoe_cl_unpack(op, buffers, back, 6 + (a->scratch > 0), p) : rmoe_cl_unpack(op, buffers, fwd, 3, p);
}

static void rmoe_shared_gate_fwd_cpu(void *buffers[], void *cl_arg)
{
	const struct rmoe_shared_gate_args *a = cl_arg;
	void *p[3];
	if (!shared_gate_unpack("shared-gate-fwd", buffers, a, 0, p))
		rmoe_kernel_shared_gate_fwd(a->tokens, a->hidden, p[0], p[1], p[2]);
}

static void rmoe_shared_gate_bwd_cpu(void *buffers[], void *cl_arg)
{
	const struct rmoe_shared_gate_args *a = cl_arg;
	void *p[7];
	if (shared_gate_unpack("shared-gate-bwd", buffers, a, 1, p))
		return;
	float *dz = malloc((size_t)(a->tokens > 0 ? a->tokens : 1) * sizeof(float));
	if (!dz) {
		rmoe_cl_fail("shared-gate-bwd", "no memory for the gate gradients of %lld tokens", (long long)a->tokens);
		return;
	}
	rmoe_kernel_shared_gate_bwd(a->tokens, a->hidden, p[0], p[1], p[2], p[3], p[4], p[5], dz);
	free(dz);
}

#ifdef RMOE_HAVE_CUDA
static void shared_gate_fwd_cuda(void *buffers[], void *cl_arg)
{
	const struct rmoe_shared_gate_args *a = cl_arg;
	void *p[3];
	if (!shared_gate_unpack("shared-gate-fwd", buffers, a, 0, p))
		rmoe_cl_cuda_done("shared-gate-fwd", rmoe_cuda_shared_gate_fwd(RMOE_STREAM, rmoe_cl_elsize(buffers[0]) == 2,
		                                                               a->tokens, a->hidden, p[0], p[1], p[2]));
}

static void shared_gate_bwd_cuda(void *buffers[], void *cl_arg)
{
	const struct rmoe_shared_gate_args *a = cl_arg;
	void *p[7];
	if (!shared_gate_unpack("shared-gate-bwd", buffers, a, 1, p))
		rmoe_cl_cuda_done("shared-gate-bwd",
		                  rmoe_cuda_shared_gate_bwd(RMOE_STREAM, rmoe_cl_elsize(buffers[0]) == 2, a->tokens,
		                                            a->hidden, p[0], p[1], p[2], p[3], p[4], p[5],
		                                            rmoe_cl_cuda_scratch(buffers, a->scratch)));
}
#endif

RMOE_CODELET(rmoe_cl_shared_gate_fwd, "shared-gate-fwd", rmoe_shared_gate_fwd_cpu, shared_gate_fwd_cuda,
             "rmoe_shared_gate_fwd_v1", shared_gate, 3);
/* 6 buffers, 7 with the device scratch. */
RMOE_CODELET(rmoe_cl_shared_gate_bwd, "shared-gate-bwd", rmoe_shared_gate_bwd_cpu, shared_gate_bwd_cuda,
             "rmoe_shared_gate_bwd_v1", shared_gate, STARPU_VARIABLE_NBUFFERS);

int rmoe_insert_shared_gate_fwd(const struct rmoe_task_opts *o, int64_t tokens, int64_t hidden,
                                starpu_data_handle_t x, starpu_data_handle_t w, starpu_data_handle_t shared_out)
{
	struct rmoe_shared_gate_args a = {tokens, hidden, 0};
	struct starpu_data_descr d[3] = {{x, STARPU_R}, {w, STARPU_R}, {shared_out, STARPU_RW}};
	return rmoe_cl_insert(o, &rmoe_cl_shared_gate_fwd, d, 3, rmoe_cl_args_dup(&a, sizeof(a)), sizeof(a),
	                      3.0 * (double)tokens * (double)hidden);
}

int rmoe_insert_shared_gate_bwd(const struct rmoe_task_opts *o, int64_t tokens, int64_t hidden,
                                starpu_data_handle_t x, starpu_data_handle_t w, starpu_data_handle_t dy,
                                starpu_data_handle_t shared_out, starpu_data_handle_t dx, starpu_data_handle_t dw)
{
	struct starpu_data_descr d[7] = {{x, STARPU_R},          {w, STARPU_R},  {dy, STARPU_R},
	                                 {shared_out, STARPU_RW}, {dx, rmoe_cl_acc_mode(o)}, {dw, STARPU_W}};
	size_t bytes = 0;
#ifdef RMOE_HAVE_CUDA
	bytes = rmoe_cuda_shared_gate_bwd_scratch(tokens);
#endif
	int64_t scratch;
	int rc = rmoe_cl_scratch("shared-gate-bwd", bytes, &d[6], &scratch);
	struct rmoe_shared_gate_args a = {tokens, hidden, scratch};
	if (!rc)
		rc = rmoe_cl_insert(o, &rmoe_cl_shared_gate_bwd, d, 6 + (scratch > 0), rmoe_cl_args_dup(&a, sizeof(a)),
		                    sizeof(a), 8.0 * (double)tokens * (double)hidden);
	rmoe_cl_scratch_release(&d[6]);
	return rc;
}
