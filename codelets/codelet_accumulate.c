/* Accumulation (dst += src), zeroing and a padded copy: the ring's partial
 * weight gradients (G_j += S, §3.1), the empty contribution of a
 * partition, and token partitions brought to the rows of the largest. */
#include "codelet.h"

/* buffers: src and dst (accumulate), dst (zero); count floats each. */
static int accumulate_unpack(const char *op, void *buffers[], const struct rmoe_accumulate_args *a, int nbuf,
                             void **p)
{
	if (a->count < 0)
		return rmoe_cl_fail(op, "count %lld", (long long)a->count);
	const struct rmoe_cl_buffer spec[] = {RMOE_CL_BUF(nbuf == 2 ? "src" : "dst", a->count),
	                                      RMOE_CL_BUF("dst", a->count)};
	return rmoe_cl_unpack(op, buffers, spec, nbuf, p);
}

static void rmoe_accumulate_cpu(void *buffers[], void *cl_arg)
{
	const struct rmoe_accumulate_args *a = cl_arg;
	void *p[2];
	if (!accumulate_unpack("grad-accumulate", buffers, a, 2, p))
		rmoe_kernel_accumulate(a->count, p[0], p[1]);
}

static void rmoe_zero_cpu(void *buffers[], void *cl_arg)
{
	const struct rmoe_accumulate_args *a = cl_arg;
	void *p[1];
	if (!accumulate_unpack("zero", buffers, a, 1, p))
		rmoe_kernel_zero(a->count, p[0]);
}

#ifdef RMOE_HAVE_CUDA
static void accumulate_cuda(void *buffers[], void *cl_arg)
{
	const struct rmoe_accumulate_args *a = cl_arg;
	void *p[2];
	if (!accumulate_unpack("grad-accumulate", buffers, a, 2, p))
		rmoe_cl_cuda_done("grad-accumulate", rmoe_cuda_accumulate(RMOE_STREAM, rmoe_cl_elsize(buffers[1]) == 2,
		                                                          a->count, p[0], p[1]));
}

static void zero_cuda(void *buffers[], void *cl_arg)
{
	const struct rmoe_accumulate_args *a = cl_arg;
	void *p[1];
	if (!accumulate_unpack("zero", buffers, a, 1, p))
		rmoe_cl_cuda_done("zero", rmoe_cuda_zero(RMOE_STREAM, rmoe_cl_elsize(buffers[0]), a->count, p[0]));
}
#endif

static void copy_pad_body(void *buffers[], const struct rmoe_copy_pad_args *a, int device)
{
	void *p[2];
	const struct rmoe_cl_buffer spec[] = {RMOE_CL_BUF("src", a->n_src), RMOE_CL_BUF("dst", a->n_dst)};
	if (a->n_src < 0 || a->n_dst < 0) {
		rmoe_cl_fail("copy-pad", "counts %lld, %lld", (long long)a->n_src, (long long)a->n_dst);
		return;
	}
	if (rmoe_cl_unpack("copy-pad", buffers, spec, 2, p))
		return;
#ifdef RMOE_HAVE_CUDA
	if (device) {
		rmoe_cl_cuda_done("copy-pad", rmoe_cuda_copy_pad(RMOE_STREAM, rmoe_cl_elsize(buffers[1]), a->n_src, a->n_dst,
		                                                 p[0], p[1]));
		return;
	}
#else
	(void)device;
#endif
	rmoe_kernel_copy_pad(a->n_src, a->n_dst, p[0], p[1]);
}

static void rmoe_copy_pad_cpu(void *buffers[], void *cl_arg)
{
	copy_pad_body(buffers, cl_arg, 0);
}

#ifdef RMOE_HAVE_CUDA
static void copy_pad_cuda(void *buffers[], void *cl_arg)
{
	copy_pad_body(buffers, cl_arg, 1);
}
#endif

RMOE_CODELET(rmoe_cl_accumulate, "grad-accumulate", rmoe_accumulate_cpu, accumulate_cuda, "rmoe_accumulate_v1",
             accumulate, 2);
RMOE_CODELET(rmoe_cl_zero, "zero", rmoe_zero_cpu, zero_cuda, "rmoe_zero_v1", zero, 1);
RMOE_CODELET(rmoe_cl_copy_pad, "copy-pad", rmoe_copy_pad_cpu, copy_pad_cuda, "rmoe_copy_pad_v1", copy_pad, 2);

int rmoe_insert_accumulate(const struct rmoe_task_opts *o, int64_t count, starpu_data_handle_t src,
                           starpu_data_handle_t dst)
{
	struct rmoe_accumulate_args a = {count};
	struct starpu_data_descr d[2] = {{src, STARPU_R}, {dst, STARPU_RW}};
	return rmoe_cl_insert(o, &rmoe_cl_accumulate, d, 2, rmoe_cl_args_dup(&a, sizeof(a)), sizeof(a), 0);
}

int rmoe_insert_zero(const struct rmoe_task_opts *o, int64_t count, starpu_data_handle_t dst)
{
	struct rmoe_accumulate_args a = {count};
	struct starpu_data_descr d[1] = {{dst, STARPU_W}};
	return rmoe_cl_insert(o, &rmoe_cl_zero, d, 1, rmoe_cl_args_dup(&a, sizeof(a)), sizeof(a), 0);
}

int rmoe_insert_copy_pad(const struct rmoe_task_opts *o, int64_t n_src, starpu_data_handle_t src, int64_t n_dst,
                         starpu_data_handle_t dst)
{
	struct rmoe_copy_pad_args a = {n_src, n_dst};
	struct starpu_data_descr d[2] = {{src, STARPU_R}, {dst, STARPU_W}};
	return rmoe_cl_insert(o, &rmoe_cl_copy_pad, d, 2, rmoe_cl_args_dup(&a, sizeof(a)), sizeof(a), 0);
}
