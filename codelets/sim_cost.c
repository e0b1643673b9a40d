/* Analytic cost models of the codelets, for StarPU's SimGrid mode (the
 * kernels do not run there; a task lasts what its model says).
 *
 * A task takes floor + max(flops / rate, bytes / bandwidth): a roofline
 * with a per-task floor (launch and scheduling). Flops and bytes come from
 * the task's arguments and buffers; the rates are per architecture. The
 * GPU defaults are an H100-class device as scheduler/clusters/mn5-acc.cluster
 * plans it (400 TFLOP/s for the grouped bf16 expert GEMMs, HBM at an
 * effective ~2.5 TB/s for the gathers, scatters and elementwise kernels);
 * the CPU defaults one core of the 2-core check machine with OpenBLAS. Every
 * rate can be set from the environment, so a calibration against a real run
 * replaces the defaults without a rebuild:
 *   RMOE_SIM_GPU_TFLOPS, RMOE_SIM_GPU_GBS, RMOE_SIM_GPU_FLOOR_US,
 *   RMOE_SIM_CPU_GFLOPS, RMOE_SIM_CPU_GBS, RMOE_SIM_CPU_FLOOR_US.
 * Compiled in every build (the real build keeps its history models and
 * never calls these); codelets/codelet.h picks them under STARPU_SIMGRID. */
#include <math.h>
#include <stdlib.h>

#include "codelet.h"

struct sim_rates {
	double flops_per_us, bytes_per_us, floor_us;
};

static struct sim_rates rmoe_sim_gpu = {400e12 * 1e-6, 2500e9 * 1e-6, 20.0};
static struct sim_rates rmoe_sim_cpu = {30e9 * 1e-6, 8e9 * 1e-6, 5.0};

/* A positive finite number from the environment times scale, or keep. */
static void rate_from_env(const char *name, double scale, double *dst)
{
	const char *s = getenv(name);
	if (!s || !*s)
		return;
	char *end;
	double v = strtod(s, &end);
	if (*end == '\0' && isfinite(v) && v >= 0)
		*dst = v * scale;
}

void rmoe_sim_cost_init(void)
{
	rate_from_env("RMOE_SIM_GPU_TFLOPS", 1e12 * 1e-6, &rmoe_sim_gpu.flops_per_us);
	rate_from_env("RMOE_SIM_GPU_GBS", 1e9 * 1e-6, &rmoe_sim_gpu.bytes_per_us);
	rate_from_env("RMOE_SIM_GPU_FLOOR_US", 1.0, &rmoe_sim_gpu.floor_us);
	rate_from_env("RMOE_SIM_CPU_GFLOPS", 1e9 * 1e-6, &rmoe_sim_cpu.flops_per_us);
	rate_from_env("RMOE_SIM_CPU_GBS", 1e9 * 1e-6, &rmoe_sim_cpu.bytes_per_us);
	rate_from_env("RMOE_SIM_CPU_FLOOR_US", 1.0, &rmoe_sim_cpu.floor_us);
}

double rmoe_sim_time_us(int gpu, double flops, double bytes)
{
	const struct sim_rates *r = gpu ? &rmoe_sim_gpu : &rmoe_sim_cpu;
	double tf = r->flops_per_us > 0 ? flops / r->flops_per_us : 0;
	double tb = r->bytes_per_us > 0 ? bytes / r->bytes_per_us : 0;
	return r->floor_us + (tf > tb ? tf : tb);
}

/* ---- per-codelet flops and bytes ------------------------------------------ */

static int is_gpu(const struct starpu_perfmodel_arch *arch)
{
	return arch->ndevices > 0 && arch->devices[0].type == STARPU_CUDA_WORKER;
}

/* Bytes of every buffer of the task, each read or written once. */
static double task_bytes(const struct starpu_task *task)
{
	double b = 0;
	for (unsigned i = 0; i < STARPU_TASK_GET_NBUFFERS(task); i++)
		b += (double)starpu_data_get_size(STARPU_TASK_GET_HANDLE(task, i));
	return b;
}

static double cost(const struct starpu_task *task, const struct starpu_perfmodel_arch *arch,
                   double flops, double bytes)
{
	(void)task;
	return rmoe_sim_time_us(is_gpu(arch), flops, bytes);
}

/* The router: logits GEMM, softmax and top-k (a few flops per logit);
 * backward two GEMMs of the same size. */
double rmoe_sim_cost_router_fwd(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	const struct rmoe_router_args *a = task->cl_arg;
	double flops = rmoe_flops_router(a->tokens, a->hidden, a->experts) + 8.0 * a->tokens * a->experts;
	return cost(task, arch, flops, task_bytes(task));
}

double rmoe_sim_cost_router_bwd(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	const struct rmoe_router_args *a = task->cl_arg;
	double flops = 2.0 * rmoe_flops_router(a->tokens, a->hidden, a->experts) + 8.0 * a->tokens * a->experts;
	/* dx is read and written. */
	double bytes = task_bytes(task) + 4.0 * a->tokens * a->hidden;
	return cost(task, arch, flops, bytes);
}

/* Counting sort of T*K pairs: memory-bound over its buffers. */
double rmoe_sim_cost_dispatch_map(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	return cost(task, arch, 0, 2.0 * task_bytes(task));
}

/* Gather and scatter-add move count rows of H floats (the scatter reads and
 * writes its destination rows); the pair indices and weights are small.
 * The full [T*H] source or destination is not touched: only its rows. */
static double rows_cost(struct starpu_task *task, struct starpu_perfmodel_arch *arch, int scatter)
{
	const struct rmoe_rows_args *a = task->cl_arg;
	double row = 4.0 * (double)a->count * (double)a->hidden;
	return cost(task, arch, (double)a->count * a->hidden, (scatter ? 3.0 : 2.0) * row + 8.0 * a->count);
}

double rmoe_sim_cost_gather(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	return rows_cost(task, arch, 0);
}

double rmoe_sim_cost_scatter_add(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	return rows_cost(task, arch, 1);
}

/* unpermute-bwd: dy rows and returned rows read, dout rows written. */
double rmoe_sim_cost_unpermute_bwd(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	const struct rmoe_rows_args *a = task->cl_arg;
	double row = 4.0 * (double)a->count * (double)a->hidden;
	return cost(task, arch, 3.0 * (double)a->count * a->hidden, 3.0 * row + 12.0 * a->count);
}

/* Grouped SwiGLU over one partition: weights read once, rows, workspace and
 * output streamed; recompute (three buffers) stops before the down GEMM. */
double rmoe_sim_cost_expert_ffn(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	const struct rmoe_expert_args *a = task->cl_arg;
	int with_down = STARPU_TASK_GET_NBUFFERS(task) == 4;
	double m = (double)a->rows, H = (double)a->hidden, F = (double)a->ffn;
	double bytes = 4.0 * ((double)rmoe_partition_weights_count(a->n_experts, a->hidden, a->ffn) +
	                      m * H * (with_down ? 2.0 : 1.0) + m * 3.0 * F);
	return cost(task, arch, rmoe_flops_expert_ffn(a->rows, a->hidden, a->ffn, with_down), bytes);
}

/* Expert backward: six GEMMs of the forward's size. */
double rmoe_sim_cost_expert_bwd(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	const struct rmoe_expert_args *a = task->cl_arg;
	double m = (double)a->rows, H = (double)a->hidden, F = (double)a->ffn;
	double weights = (double)rmoe_partition_weights_count(a->n_experts, a->hidden, a->ffn);
	/* weights read, gradient written (and read when accumulating); x, dy
	 * and dx rows; the workspace read and rewritten. Only the rows' dx,
	 * not the whole [T*H] destination. */
	double bytes = 4.0 * (weights * (a->accumulate ? 3.0 : 2.0) + 3.0 * m * H + 2.0 * m * 4.0 * F);
	return cost(task, arch, rmoe_flops_expert_bwd(a->rows, a->hidden, a->ffn), bytes);
}

/* accumulate reads src and reads and writes dst; zero writes dst. */
double rmoe_sim_cost_accumulate(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	const struct rmoe_accumulate_args *a = task->cl_arg;
	return cost(task, arch, (double)a->count, 3.0 * 4.0 * (double)a->count);
}

double rmoe_sim_cost_zero(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	const struct rmoe_accumulate_args *a = task->cl_arg;
	return cost(task, arch, 0, 4.0 * (double)a->count);
}

/* sort-chunks: every row read once and written once. */
double rmoe_sim_cost_sort_chunks(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	return cost(task, arch, 0, task_bytes(task));
}
