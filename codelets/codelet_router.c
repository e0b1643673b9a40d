/* The router: softmax and top-k forward, and its backward. */
#include "codelet.h"

/* Sane arguments, then the buffers: x, w_router, probs, topk_idx, topk_w,
 * and for the backward dg, dx, dw_router and optionally dprobs; nbuf of
 * them, then the device scratch when the task has one (a->scratch). */
static int router_unpack(const char *op, void *buffers[], const struct rmoe_router_args *a, int nbuf, void **p)
{
	if (!(rmoe_cl_dim_ok(a->tokens) && rmoe_cl_dim_ok(a->hidden) && a->experts >= 1 && rmoe_cl_dim_ok(a->experts) &&
	      a->topk >= 1 && a->topk <= a->experts && a->scratch >= 0))
		return rmoe_cl_fail(op, "bad shape T=%lld H=%lld E=%lld K=%lld", (long long)a->tokens,
		                    (long long)a->hidden, (long long)a->experts, (long long)a->topk);
	const int64_t T = a->tokens, H = a->hidden, E = a->experts, K = a->topk;
	struct rmoe_cl_buffer spec[] = {
		RMOE_CL_BUF("x", T * H),      RMOE_CL_BUF("w_router", H * E), RMOE_CL_BUF("probs", T * E),
		RMOE_CL_BUF("topk_idx", T * K), RMOE_CL_BUF("topk_w", T * K), RMOE_CL_BUF("dg", T * K),
		RMOE_CL_BUF("dx", T * H),     RMOE_CL_BUF("dw_router", H * E), RMOE_CL_BUF("dprobs", T * E),
		RMOE_CL_BUF("scratch", 0)};
	spec[nbuf] = (struct rmoe_cl_buffer)RMOE_CL_BUF("scratch", a->scratch);
	return rmoe_cl_unpack(op, buffers, spec, nbuf + (a->scratch > 0), p);
}

/* The backward's buffers before its scratch: 8, or 9 with dprobs. */
static int router_bwd_nbuf(const struct rmoe_router_args *a)
{
	struct starpu_task *task = starpu_task_get_current();
	return task && (int)STARPU_TASK_GET_NBUFFERS(task) - (a->scratch > 0) > 8 ? 9 : 8;
}

static void rmoe_router_fwd_cpu(void *buffers[], void *cl_arg)
{
	const struct rmoe_router_args *a = cl_arg;
	void *p[6];
	if (!router_unpack("router-fwd", buffers, a, 5, p))
		rmoe_kernel_router_fwd(a->tokens, a->hidden, a->experts, a->topk, a->norm_topk, p[0], p[1], p[2], p[3],
		                       p[4]);
}

static void rmoe_router_bwd_cpu(void *buffers[], void *cl_arg)
{
	const struct rmoe_router_args *a = cl_arg;
	const int nbuf = router_bwd_nbuf(a);
	void *p[10] = {NULL};
	if (router_unpack("router-bwd", buffers, a, nbuf, p))
		return;
	const int32_t *idx = p[3];
	for (int64_t i = 0; i < a->tokens * a->topk; i++)
		if (idx[i] < 0 || idx[i] >= a->experts) {
			rmoe_cl_fail("router-bwd", "topk_idx[%lld] = %d, not an expert of %lld", (long long)i, (int)idx[i],
			             (long long)a->experts);
			return;
		}
	if (rmoe_kernel_router_bwd(a->tokens, a->hidden, a->experts, a->topk, a->norm_topk, p[0], p[1], p[2], p[3],
	                           p[4], p[5], nbuf > 8 ? p[8] : NULL, p[6], p[7]))
		rmoe_cl_fail("router-bwd", "no memory for the dlogits of %lld experts", (long long)a->experts);
}

#ifdef RMOE_HAVE_CUDA
static void router_fwd_cuda(void *buffers[], void *cl_arg)
{
	const struct rmoe_router_args *a = cl_arg;
	void *p[6];
	if (!router_unpack("router-fwd", buffers, a, 5, p))
		rmoe_cl_cuda_done("router-fwd",
		                  rmoe_cuda_router_fwd(RMOE_STREAM, rmoe_cl_cublas(), rmoe_cl_elsize(buffers[0]) == 2, a->tokens,
		                                       a->hidden, a->experts, a->topk, a->norm_topk, p[0], p[1], p[2], p[3],
		                                       p[4], rmoe_cl_cuda_scratch(buffers, a->scratch)));
}

static void router_bwd_cuda(void *buffers[], void *cl_arg)
{
	const struct rmoe_router_args *a = cl_arg;
	const int nbuf = router_bwd_nbuf(a);
	void *p[10] = {NULL};
	if (!router_unpack("router-bwd", buffers, a, nbuf, p))
		rmoe_cl_cuda_done("router-bwd",
		                  rmoe_cuda_router_bwd(RMOE_STREAM, rmoe_cl_cublas(), rmoe_cl_elsize(buffers[0]) == 2, a->tokens,
		                                       a->hidden, a->experts, a->topk, a->norm_topk, p[0], p[1], p[2], p[3],
		                                       p[4], p[5], nbuf > 8 ? p[8] : NULL, p[6], p[7],
		                                       rmoe_cl_cuda_scratch(buffers, a->scratch)));
}
#endif

/* 5 buffers, 6 with the device scratch. */
RMOE_CODELET(rmoe_cl_router_fwd, "router-fwd", rmoe_router_fwd_cpu, router_fwd_cuda, "rmoe_router_fwd_v2", router_fwd,
             STARPU_VARIABLE_NBUFFERS);
/* 8 buffers, or 9 with dprobs; one more with the device scratch. */
RMOE_CODELET(rmoe_cl_router_bwd, "router-bwd", rmoe_router_bwd_cpu, router_bwd_cuda, "rmoe_router_bwd_v2",
             router_bwd, STARPU_VARIABLE_NBUFFERS);

static void *router_args(const struct rmoe_router_shape *s, int64_t scratch)
{
	struct rmoe_router_args a = {s->tokens, s->hidden, s->experts, s->topk, s->norm_topk, scratch};
	return rmoe_cl_args_dup(&a, sizeof(a));
}

/* The device scratch of a router task on x (CUDA codelets: the fp32 rows
 * of bf16 activations, the backward's dlogits), in *d. */
static int router_scratch(int bwd, const struct rmoe_router_shape *s, starpu_data_handle_t x,
                          struct starpu_data_descr *d, int64_t *n)
{
	size_t bytes = 0;
#ifdef RMOE_HAVE_CUDA
	const int bf16 = starpu_vector_get_elemsize(x) == 2;
	bytes = bwd ? rmoe_cuda_router_bwd_scratch(bf16, s->tokens, s->hidden, s->experts)
	            : rmoe_cuda_router_fwd_scratch(bf16, s->tokens, s->hidden, s->experts);
#else
	(void)bwd;
	(void)s;
	(void)x;
#endif
	return rmoe_cl_scratch(bwd ? "router-bwd" : "router-fwd", bytes, d, n);
}

int rmoe_insert_router_fwd(const struct rmoe_task_opts *o, const struct rmoe_router_shape *s,
                           starpu_data_handle_t x, starpu_data_handle_t w_router, starpu_data_handle_t probs,
                           starpu_data_handle_t topk_idx, starpu_data_handle_t topk_w)
{
	struct starpu_data_descr d[6] = {
		{x, STARPU_R}, {w_router, STARPU_R}, {probs, STARPU_W}, {topk_idx, STARPU_W}, {topk_w, STARPU_W}};
	int64_t scratch;
	int rc = router_scratch(0, s, x, &d[5], &scratch);
	if (!rc)
		rc = rmoe_cl_insert(o, &rmoe_cl_router_fwd, d, 5 + (scratch > 0), router_args(s, scratch),
		                    sizeof(struct rmoe_router_args), rmoe_flops_router(s->tokens, s->hidden, s->experts));
	rmoe_cl_scratch_release(&d[5]);
	return rc;
}

int rmoe_insert_router_bwd(const struct rmoe_task_opts *o, const struct rmoe_router_shape *s,
                           starpu_data_handle_t x, starpu_data_handle_t w_router, starpu_data_handle_t probs,
                           starpu_data_handle_t topk_idx, starpu_data_handle_t topk_w, starpu_data_handle_t dg,
                           starpu_data_handle_t dprobs, starpu_data_handle_t dx, starpu_data_handle_t dw_router)
{
	struct starpu_data_descr d[10] = {
		{x, STARPU_R},      {w_router, STARPU_R}, {probs, STARPU_R},     {topk_idx, STARPU_R},
		{topk_w, STARPU_R}, {dg, STARPU_R},       {dx, STARPU_RW},       {dw_router, STARPU_W},
		{dprobs, STARPU_R},
	};
	const int nd = dprobs ? 9 : 8;
	int64_t scratch;
	int rc = router_scratch(1, s, x, &d[nd], &scratch);
	if (!rc)
		rc = rmoe_cl_insert(o, &rmoe_cl_router_bwd, d, nd + (scratch > 0), router_args(s, scratch),
		                    sizeof(struct rmoe_router_args), 2 * rmoe_flops_router(s->tokens, s->hidden, s->experts));
	rmoe_cl_scratch_release(&d[nd]);
	return rc;
}
