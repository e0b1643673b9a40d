/* Cost models of the codelets for StarPU's SimGrid mode (the kernels do
 * not run there; a task lasts what its model says).
 *
 * Analytic (the default): a task takes floor + max(flops / rate, bytes /
 * bandwidth), a roofline with a per-task floor (launch and scheduling).
 * Flops and bytes come from the task's arguments and buffers; the rates are
 * per architecture. The GPU defaults are an H100-class device as
 * scheduler/clusters/mn5-acc.cluster plans it (400 TFLOP/s for the grouped
 * bf16 expert GEMMs, HBM at an effective ~2.5 TB/s for the gathers,
 * scatters and elementwise kernels); the CPU defaults one core of the
 * 2-core check machine with OpenBLAS. Every rate can be set from the
 * environment, so a calibration replaces the defaults without a rebuild:
 *   RMOE_SIM_GPU_TFLOPS, RMOE_SIM_GPU_GBS, RMOE_SIM_GPU_FLOOR_US,
 *   RMOE_SIM_CPU_GFLOPS, RMOE_SIM_CPU_GBS, RMOE_SIM_CPU_FLOOR_US.
 *
 * Recorded (StarPU's own calibrate-then-simulate workflow): with
 *   RMOE_SIM_HISTORY=DIR  RMOE_SIM_HISTORY_HOST=HOST
 * every codelet lasts what the history perfmodel a real run recorded says
 * (the real build's models are history-based, codelet.h; a run with
 * STARPU_CALIBRATE=1 writes DIR/codelets/45/SYMBOL.HOST under its
 * STARPU_HOME/.starpu/sampling; bench/sim/calibrate.sh records them). A
 * task whose buffer sizes the real run executed (the same data footprint)
 * takes the recorded mean; any other (the simulation draws its routing, so
 * a hop's row count can differ from the real run's) takes a least-squares
 * line t = a + b x over the recorded entries of that codelet and
 * architecture, x the task's flops (or its bytes for codelets recorded
 * without flops). A codelet or architecture the recording lacks is an error
 * at start-up or names itself when the task comes, rather than falling back
 * to the analytic model.
 * Compiled only into the simulation build (sim_cost.h); the real build
 * keeps its history models. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codelet.h"
#include "sim_cost.h"
#include "rmoe_system.h"

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

static int history_init(void);

int rmoe_sim_cost_init(void)
{
	rate_from_env("RMOE_SIM_GPU_TFLOPS", 1e12 * 1e-6, &rmoe_sim_gpu.flops_per_us);
	rate_from_env("RMOE_SIM_GPU_GBS", 1e9 * 1e-6, &rmoe_sim_gpu.bytes_per_us);
	rate_from_env("RMOE_SIM_GPU_FLOOR_US", 1.0, &rmoe_sim_gpu.floor_us);
	rate_from_env("RMOE_SIM_CPU_GFLOPS", 1e9 * 1e-6, &rmoe_sim_cpu.flops_per_us);
	rate_from_env("RMOE_SIM_CPU_GBS", 1e9 * 1e-6, &rmoe_sim_cpu.bytes_per_us);
	rate_from_env("RMOE_SIM_CPU_FLOOR_US", 1.0, &rmoe_sim_cpu.floor_us);
	return history_init();
}

double rmoe_sim_time_us(int gpu, double flops, double bytes)
{
	const struct sim_rates *r = gpu ? &rmoe_sim_gpu : &rmoe_sim_cpu;
	double tf = r->flops_per_us > 0 ? flops / r->flops_per_us : 0;
	double tb = r->bytes_per_us > 0 ? bytes / r->bytes_per_us : 0;
	return r->floor_us + (tf > tb ? tf : tb);
}

/* ---- recorded history models ----------------------------------------------- */

#define SIM_HISTORY_MAX 32   /* codelet symbols */
#define SIM_HISTORY_ARCHS 4  /* architectures replayed per symbol */

/* One recorded entry: footprint, regressor, mean (us), samples. */
struct sim_point {
	uint32_t footprint;
	double x, t, n;
};

/* The entries of one symbol on one architecture, and their line. */
struct sim_fit {
	int comb;
	int npts, by_flops;
	struct sim_point *pts;
	double a, b;
};

struct sim_history {
	char symbol[128];
	struct starpu_perfmodel model;
	struct sim_fit fit[SIM_HISTORY_ARCHS];
	int nfit;
};

static struct sim_history *sim_hist;
static int sim_nhist = -1; /* -1: analytic costs */
static char sim_hist_where[1024];

/* Loads every rmoe_* model recorded for host in dir/codelets/45. */
static int history_load(const char *dir, const char *host)
{
	char path[2048];
	snprintf(sim_hist_where, sizeof(sim_hist_where), "%s/codelets/45 (host %s)", dir, host);
	snprintf(path, sizeof(path), "%s/codelets/45", dir);
	DIR *d = opendir(path);
	if (!d)
		return rmoe_error(RMOE_EIO, "RMOE_SIM_HISTORY=%s: no folder %s (a sampling folder of a run with "
		                  "STARPU_CALIBRATE=1: bench/sim/calibrate.sh)", dir, path);
	sim_hist = calloc(SIM_HISTORY_MAX, sizeof(*sim_hist));
	sim_nhist = 0;
	const size_t hl = strlen(host);
	struct dirent *e;
	int rc = sim_hist ? 0 : rmoe_error(RMOE_ENOMEM, "out of host memory for the recorded models");
	while (!rc && (e = readdir(d))) {
		size_t nl = strlen(e->d_name);
		if (strncmp(e->d_name, "rmoe_", 5) || nl <= hl + 1 || e->d_name[nl - hl - 1] != '.' ||
		    strcmp(e->d_name + nl - hl, host) || nl - hl - 1 >= sizeof(sim_hist->symbol))
			continue;
		if (sim_nhist == SIM_HISTORY_MAX) {
			rc = rmoe_error(RMOE_EINVAL, "%s: more than %d recorded models", sim_hist_where, SIM_HISTORY_MAX);
			break;
		}
		struct sim_history *h = &sim_hist[sim_nhist];
		memcpy(h->symbol, e->d_name, nl - hl - 1);
		snprintf(path, sizeof(path), "%s/codelets/45/%s", dir, e->d_name);
		if (starpu_perfmodel_load_file(path, &h->model))
			rc = rmoe_error(RMOE_EFORMAT, "%s: StarPU cannot read this perfmodel", path);
		else
			sim_nhist++;
	}
	closedir(d);
	if (!rc && sim_nhist == 0)
		rc = rmoe_error(RMOE_EINVAL, "RMOE_SIM_HISTORY: no rmoe_*.%s model in %s/codelets/45 (is the host name "
		                "the recording's, RMOE_SIM_HISTORY_HOST?)", host, dir);
	return rc;
}

static int history_init(void)
{
	const char *dir = rmoe_env(RMOE_ENV_SIM_HISTORY);
	if (!dir || !*dir)
		return 0;
	const char *host = rmoe_env(RMOE_ENV_SIM_HISTORY_HOST);
	struct stat st;
	if (!host || !*host)
		return rmoe_error(RMOE_EINVAL, "RMOE_SIM_HISTORY=%s needs RMOE_SIM_HISTORY_HOST, the host name the "
		                  "models were recorded under", dir);
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
		return rmoe_error(RMOE_EIO, "RMOE_SIM_HISTORY=%s: not a folder", dir);
	if (sim_nhist >= 0)
		return 0;
	return history_load(dir, host);
}

/* Weighted least squares t = a + b x with a, b >= 0 over the points. */
static void fit_line(struct sim_fit *f)
{
	double sw = 0, sx = 0, st = 0, sxx = 0, sxt = 0;
	for (int i = 0; i < f->npts; i++) {
		const struct sim_point *p = &f->pts[i];
		sw += p->n;
		sx += p->n * p->x;
		st += p->n * p->t;
		sxx += p->n * p->x * p->x;
		sxt += p->n * p->x * p->t;
	}
	double det = sw * sxx - sx * sx;
	f->b = det > 0 ? (sw * sxt - sx * st) / det : 0;
	f->a = det > 0 ? (st - f->b * sx) / sw : 0;
	if (det <= 0 || f->b < 0) { /* one size only, or no growth: the mean, scaled by x */
		f->a = 0;
		f->b = sx > 0 ? st / sx : 0;
		if (f->b == 0)
			f->a = sw > 0 ? st / sw : 0;
	} else if (f->a < 0) { /* through the origin */
		f->a = 0;
		f->b = sxx > 0 ? sxt / sxx : 0;
	}
}

/* The entries of h on arch as points and their line; NULL if none. */
static struct sim_fit *history_fit(struct sim_history *h, struct starpu_perfmodel_arch *arch)
{
	int comb = starpu_perfmodel_arch_comb_get(arch->ndevices, arch->devices);
	for (int i = 0; i < h->nfit; i++)
		if (h->fit[i].comb == comb)
			return h->fit[i].npts ? &h->fit[i] : NULL;
	if (h->nfit == SIM_HISTORY_ARCHS)
		return NULL;
	struct sim_fit *f = &h->fit[h->nfit++];
	*f = (struct sim_fit){.comb = comb, .by_flops = 1};
	struct starpu_perfmodel_per_arch *pa = comb < 0 ? NULL : starpu_perfmodel_get_model_per_arch(&h->model, arch, 0);
	int n = 0;
	for (struct starpu_perfmodel_history_list *l = pa ? pa->list : NULL; l; l = l->next)
		if (l->entry->nsample > 0) {
			n++;
			f->by_flops &= isfinite(l->entry->flops) && l->entry->flops > 0;
		}
	if (!n || !(f->pts = calloc((size_t)n, sizeof(*f->pts))))
		return NULL;
	for (struct starpu_perfmodel_history_list *l = pa->list; l; l = l->next) {
		const struct starpu_perfmodel_history_entry *e = l->entry;
		if (e->nsample > 0)
			f->pts[f->npts++] = (struct sim_point){e->footprint, f->by_flops ? e->flops : (double)e->size,
			                                       e->mean, e->nsample};
	}
	fit_line(f);
	return f;
}

/* The bytes of the task's buffers (StarPU's history entries record the
 * same sum as their size). */
static double task_bytes(const struct starpu_task *task)
{
	double b = 0;
	for (unsigned i = 0; i < STARPU_TASK_GET_NBUFFERS(task); i++)
		b += (double)starpu_data_get_size(STARPU_TASK_GET_HANDLE(task, i));
	return b;
}

/* The recorded duration of task on arch, in us; NAN (StarPU then stops
 * the simulation naming the codelet) when the recording lacks it. */
static double history_cost(const struct starpu_task *task, struct starpu_perfmodel_arch *arch)
{
	const char *sym = task->cl->model->symbol;
	struct sim_history *h = NULL;
	for (int i = 0; i < sim_nhist && !h; i++)
		if (!strcmp(sim_hist[i].symbol, sym))
			h = &sim_hist[i];
	struct sim_fit *f = h ? history_fit(h, arch) : NULL;
	if (!f) {
		char name[64];
		starpu_perfmodel_get_arch_name(arch, name, sizeof(name), 0);
		fprintf(stderr, "relaymoe: no recorded model of %s on %s in %s\n", sym, name, sim_hist_where);
		return NAN;
	}
	uint32_t fp = starpu_task_data_footprint((struct starpu_task *)task);
	for (int i = 0; i < f->npts; i++)
		if (f->pts[i].footprint == fp)
			return f->pts[i].t;
	return f->a + f->b * (f->by_flops ? task->flops : task_bytes(task));
}

/* ---- per-codelet flops and bytes ------------------------------------------ */

static int is_gpu(const struct starpu_perfmodel_arch *arch)
{
	return arch->ndevices > 0 && arch->devices[0].type == STARPU_CUDA_WORKER;
}

/* Bytes of every buffer of the task, each read or written once. */
static double cost(const struct starpu_task *task, struct starpu_perfmodel_arch *arch, double flops, double bytes)
{
	if (sim_nhist >= 0)
		return history_cost(task, arch);
	return rmoe_sim_time_us(is_gpu(arch), flops, bytes);
}

/* The router: logits GEMM, softmax and top-k (a few flops per logit);
 * backward two GEMMs of the same size. */
double rmoe_sim_cost_router_fwd(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	const struct rmoe_router_args *a = rmoe_cl_payload(task->cl_arg);
	double flops = rmoe_flops_router(a->tokens, a->hidden, a->experts) + 8.0 * a->tokens * a->experts;
	return cost(task, arch, flops, task_bytes(task));
}

double rmoe_sim_cost_router_bwd(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	const struct rmoe_router_args *a = rmoe_cl_payload(task->cl_arg);
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
	const struct rmoe_rows_args *a = rmoe_cl_payload(task->cl_arg);
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
	const struct rmoe_rows_args *a = rmoe_cl_payload(task->cl_arg);
	double row = 4.0 * (double)a->count * (double)a->hidden;
	return cost(task, arch, 3.0 * (double)a->count * a->hidden, 3.0 * row + 12.0 * a->count);
}

/* Grouped SwiGLU over one partition: weights read once, rows, workspace and
 * output streamed; recompute (three buffers) stops before the down GEMM. */
double rmoe_sim_cost_expert_ffn(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	const struct rmoe_expert_args *a = rmoe_cl_payload(task->cl_arg);
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
	const struct rmoe_expert_args *a = rmoe_cl_payload(task->cl_arg);
	double m = (double)a->rows, H = (double)a->hidden, F = (double)a->ffn;
	double weights = (double)rmoe_partition_weights_count(a->n_experts, a->hidden, a->ffn);
	/* weights read, gradient written (and read when accumulating); x, dy
	 * and dx rows; the workspace read and rewritten. Only the rows' dx,
	 * not the whole [T*H] destination. */
	double bytes = 4.0 * (weights * (a->accumulate ? 3.0 : 2.0) + 3.0 * m * H + 2.0 * m * 4.0 * F);
	return cost(task, arch, rmoe_flops_expert_bwd(a->rows, a->hidden, a->ffn), bytes);
}

/* shared-gate: a few passes over its [T,H] buffers. */
double rmoe_sim_cost_shared_gate(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	const struct rmoe_shared_gate_args *a = rmoe_cl_payload(task->cl_arg);
	return cost(task, arch, 8.0 * (double)a->tokens * (double)a->hidden, task_bytes(task));
}

/* accumulate reads src and reads and writes dst; zero writes dst. */
double rmoe_sim_cost_accumulate(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	const struct rmoe_accumulate_args *a = rmoe_cl_payload(task->cl_arg);
	return cost(task, arch, (double)a->count, 3.0 * 4.0 * (double)a->count);
}

double rmoe_sim_cost_zero(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	const struct rmoe_accumulate_args *a = rmoe_cl_payload(task->cl_arg);
	return cost(task, arch, 0, 4.0 * (double)a->count);
}

/* copy-pad reads the source and writes the destination. */
double rmoe_sim_cost_copy_pad(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	const struct rmoe_copy_pad_args *a = rmoe_cl_payload(task->cl_arg);
	return cost(task, arch, 0, 4.0 * (double)(a->n_src + a->n_dst));
}

/* sort-chunks: every row read once and written once. */
double rmoe_sim_cost_sort_chunks(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)nimpl;
	return cost(task, arch, 0, task_bytes(task));
}
