/* relaymoe run: one MoE layer, forward and backward, with the ring and the
 * all-to-all dispatchers side by side on the same inputs and weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app.h"
#include "options.h"
#include "rmoe_config.h"
#include "rmoe_memory_model.h"
#include "rmoe_scheduler.h"

/* --check against the double-precision reference: fp32 rounding over the
 * layer's sums; bf16 storage (8 significant bits) of the intermediates and
 * of the relayed gradients. */
#define CHECK_TOLERANCE_F32 1e-5
#define CHECK_TOLERANCE_BF16 1e-2
#ifdef RMOE_SIMGRID
#define RMOE_SIMULATED 1
#else
#define RMOE_SIMULATED 0
#endif

struct run_opts {
	struct rmoe_preset_opts preset;
	struct rmoe_shape_opts shape;
	struct rmoe_ring_opts ring;
	int64_t chunk_rows, seed, repeat, partitions;
	int64_t blas_threads;           /* 0: the context's automatic count */
	const char *dispatch, *load, *dump, *csv, *io, *routing;
	const char *trace, *sched;      /* traces and scheduler experiments */
	int no_prio;
	int check, norm_topk, no_norm_topk, shared_gated, no_overlap, quiet, verbose;
	int check_finite;
	int deterministic;
};

static const char *usage_head =
	"usage: mpirun -np N relaymoe run [options]\n"
	"\n"
	"Runs one MoE layer (router, top-k, SwiGLU experts) forward and backward on N\n"
	"ranks, with the ring dispatcher of RelayMoE and three all-to-all baselines side\n"
	"by side, and reports time, memory and the difference between them. a2a is\n"
	"the lean all-to-all: pipelined per peer and chunk, rows received in expert\n"
	"order, --chunk-rows and --mem-cap as for the ring, its backward the ring's\n"
	"pair-weighted expert kernel on exchanged x and dy rows; a2a-megatron is\n"
	"Megatron Core 0.13's alltoall token dispatcher (through 0.15): routing\n"
	"probabilities exchanged beside the tokens and applied in the expert, the\n"
	"unpermute without them, the backward recomputing dispatch and experts, no\n"
	"combine outputs kept; a2a-deepep is DeepEP's normal-mode dispatch: a token\n"
	"sent once to each rank owning one of its experts, expanded there, each\n"
	"token's outputs reduced on that rank before one row goes back, on a2a's\n"
	"per-peer pipeline (whole blocks: no --chunk-rows or --mem-cap).\n"
	"Default: the Qwen3-30B-A3B layer with H, F and tokens divided by 16 (H=128,\n"
	"F=48, E=128, K=8, 3072 tokens per rank), ring, a2a, a2a-megatron and\n"
	"a2a-deepep.\n"
	"\n";

static const char *usage_tail =
	"\n"
	".npy layout (float32, C order): x.npy, dy.npy [N*T, H] (rank r: rows r*T..);\n"
	"w_router.npy [H, E]; w_gate.npy, w_up.npy [E, H, F]; w_down.npy [E, F, H];\n"
	"with --shared-ffn FS w_shared_gate.npy, w_shared_up.npy [H, FS], w_shared_down.npy\n"
	"[FS, H], and with --shared-gated w_shared_expert_gate.npy [H];\n"
	"outputs y, dx, dw_router (summed over ranks), dw_gate, dw_up, dw_down alike,\n"
	"dw_shared_* and dw_shared_expert_gate (summed over ranks).\n"
	"--dump writes the inputs too, and the outputs of the first dispatcher run.\n";

/* The options of relaymoe run, set by set, into r: as rmoe_app_options. */
static int parse_options(struct run_opts *r, int argc, char **argv, int first, char *msg, size_t len)
{
	const struct rmoe_opt shape[] = {RMOE_PRESET_OPTIONS(&r->preset), RMOE_SHAPE_OPTIONS(&r->shape)};
	const struct rmoe_opt layer[] = {
		RMOE_RING_OPTIONS(&r->ring),
		{"chunk-rows", RMOE_OPT_INT, &r->chunk_rows, 0, 1e12, "C", "split each hop (a2a: each exchanged block) into chunks of C rows", NULL},
		{"partitions", RMOE_OPT_INT, &r->partitions, 1, 1e6, "P", "rings: each rank's experts as P partitions (hops on one device)", NULL},
		{"norm-topk", RMOE_OPT_FLAG, &r->norm_topk, 0, 0, NULL, "renormalise the top-k probabilities (the default, unless the preset's model does not)", NULL},
		{"no-norm-topk", RMOE_OPT_FLAG, &r->no_norm_topk, 0, 0, NULL, "keep top-k probabilities unnormalised", NULL},
		{"shared-gated", RMOE_OPT_FLAG, &r->shared_gated, 0, 0, NULL, "scale the shared expert by sigmoid(x w_shared_expert_gate), as Qwen2-MoE (default: ungated, DeepSeek-style)", NULL},
		{"no-overlap", RMOE_OPT_FLAG, &r->no_overlap, 0, 0, NULL, "serialise ring transfers and compute", NULL},
		{"check-finite", RMOE_OPT_FLAG, &r->check_finite, 0, 0, NULL, "refuse NaN or infinity in inputs and weights", NULL},
		{"deterministic", RMOE_OPT_FLAG, &r->deterministic, 0, 0, NULL, "accumulate in submission order: bit-reproducible outputs", NULL},
	};
	const struct rmoe_opt run[] = {
		{"dispatch", RMOE_OPT_STRING, &r->dispatch, 0, 0, "D", "ring, token, a2a, a2a-megatron, a2a-deepep, auto, both (ring+a2a), baselines (ring and every all-to-all), all, or a comma list of them", NULL},
		RMOE_SEED_OPTION(&r->seed),
		{"repeat", RMOE_OPT_INT, &r->repeat, 1, 1000, "R", "timed repetitions after a warm-up", NULL},
		{"io", RMOE_OPT_STRING, &r->io, 0, 0, "host|device", "where x, y, dy, dx live during the timed passes", NULL},
		{"load", RMOE_OPT_STRING, &r->load, 0, 0, "DIR", "read inputs and weights from DIR/*.npy", NULL},
		{"check", RMOE_OPT_FLAG, &r->check, 0, 0, NULL, "compare with the reference; exit 1 past 1e-5 (bf16: 1e-2)", NULL},
	};
	const struct rmoe_opt starpu[] = {
		{"sched", RMOE_OPT_STRING, &r->sched, 0, 0, "POLICY", "StarPU scheduling policy (lws, prio, ws, dmdas, eager, ...)", NULL},
		{"no-prio", RMOE_OPT_FLAG, &r->no_prio, 0, 0, NULL, "give every task and transfer the same priority", NULL},
		{"blas-threads", RMOE_OPT_INT, &r->blas_threads, 0, 4096, "N", "OpenBLAS threads per call (0: automatic, the cores the workers leave)", NULL},
		{"trace", RMOE_OPT_STRING, &r->trace, 0, 0, "DIR", "record an FxT trace of every rank, converted into DIR", NULL},
	};
	const struct rmoe_opt output[] = {
		{"dump", RMOE_OPT_STRING, &r->dump, 0, 0, "DIR", "write inputs and outputs to DIR/*.npy", NULL},
		{"csv", RMOE_OPT_STRING, &r->csv, 0, 0, "FILE", "append one result row per dispatcher", NULL},
		{"routing", RMOE_OPT_STRING, &r->routing, 0, 0, "FILE", "write the rows each rank routed to each expert (CSV)", NULL},
		{"quiet", RMOE_OPT_FLAG, &r->quiet, 0, 0, NULL, "print the summary only", NULL},
		{"verbose", RMOE_OPT_FLAG, &r->verbose, 0, 0, NULL, "print the context's decisions: workers, ring, the runtime's structure sizes", NULL},
	};
	const struct rmoe_opt_set sets[] = {
		RMOE_OPT_SET("the layer's shape", shape, RMOE_PRESET_NOTE),
		RMOE_OPT_SET("the layer", layer, NULL),
		RMOE_OPT_SET("the run", run, NULL),
		RMOE_OPT_SET("StarPU", starpu, NULL),
		RMOE_OPT_SET("output", output, NULL),
	};
	return rmoe_app_options(sets, RMOE_NELEMS(sets), argc, argv, first, usage_head, usage_tail, msg, len);
}

/* Builds the layer configuration from the options; 0 or RMOE_EINVAL. */
static int make_config(const struct run_opts *r, struct rmoe_layer_config *cfg, char *msg, size_t len)
{
	int rc = rmoe_app_shape_config(&r->preset, &r->shape, cfg, msg, len);
	if (!rc)
		rc = rmoe_app_ring_config(&r->ring, cfg, msg, len);
	if (rc)
		return rc;
	if (r->norm_topk && r->no_norm_topk) {
		snprintf(msg, len, "--norm-topk and --no-norm-topk: expected one of them");
		return RMOE_EINVAL;
	}
	if (r->norm_topk || r->no_norm_topk)
		cfg->norm_topk = r->norm_topk;
	if (r->shared_gated && cfg->shared_ffn == 0) {
		snprintf(msg, len, "--shared-gated needs a shared expert: expected --shared-ffn FS with FS > 0");
		return RMOE_EINVAL;
	}
	if (r->shared_gated)
		cfg->shared_gated = 1;
	cfg->overlap = !r->no_overlap;
	cfg->chunk_rows = r->chunk_rows;
	cfg->check_finite = r->check_finite;
	cfg->deterministic = r->deterministic;
	cfg->partitions = r->partitions;
	if (strcmp(r->io, "host") && strcmp(r->io, "device")) {
		snprintf(msg, len, "--io '%s': expected host or device", r->io);
		return RMOE_EINVAL;
	}
	return 0;
}

struct outcome {
	enum rmoe_dispatch d;
	double fwd_ms, bwd_ms;          /* medians, max over ranks */
	double peak_fwd, peak_bwd;      /* bytes, max over ranks */
	double resident, rss, sent;     /* bytes, max over ranks */
	double sent_fwd, sent_bwd;      /* of sent, each pass's, max over ranks (a bound's wire and staging terms) */
	double largest_temp;
	double model_fwd, model_bwd;    /* the memory model's peaks for the routing seen */
	double leave_fwd, leave_bwd;    /* of them, a2a's rows that may leave first (the model's leaving_*) */
	double skew;                    /* busiest hop (rings, a2a) or rank (a2a-megatron) over even */
	int64_t chunk_rows;
	double device_fwd, device_bwd;  /* peak on the device (a GPU), bytes, max over ranks; 0: none */
	double heap_fwd, heap_bwd;      /* the heap figure (peak_heap_*), bytes, max over ranks */
	double runtime_fwd, runtime_bwd; /* the runtime's structures of a pass's graph (runtime_*_bytes),
	                                    bytes, max over ranks: the model's term for the heap figure */
	double fb_med, fb_min, fb_max;  /* forward+backward per repetition: median and range, ms */
	double ratio_med, ratio_min, ratio_max; /* forward+backward over the first dispatcher's, per repetition */
};

/* blocks: a2a's, the routing seen (NULL: the skew's bound). */
static void model_peaks(const struct rmoe_problem *p, struct outcome *o, const int64_t *blocks)
{
	struct rmoe_mem_config mc;
	rmoe_mem_config_from_layer(&mc, &p->cfg, p->nranks);
	mc.chunk_rows = o->chunk_rows;
	mc.skew = o->skew;
	mc.blocks = blocks;
	mc.block_tokens = blocks ? blocks + p->nranks * p->nranks : NULL;
	struct rmoe_mem_estimate e;
	if (rmoe_memory_model(o->d, &mc, &e) == 0) {
		o->model_fwd = (double)e.peak_forward;
		o->model_bwd = (double)e.peak_backward;
		o->leave_fwd = (double)e.leaving_forward;
		o->leave_bwd = (double)e.leaving_backward;
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double max_over_ranks(double v)
{
	double m = v;
	MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	return m;
}

/* --dispatch all: ring, token, a2a, a2a-megatron, a2a-deepep. */
enum { MAX_DISPATCHERS = 5 };

/* One dispatcher of a run: its layer and what its passes measured. */
struct contender {
	enum rmoe_dispatch d;
	rmoe_layer *layer;
	double *fw, *bw;              /* per timed repetition, ms, this rank */
	struct rmoe_layer_stats st;   /* of the last pass */
	double peak_f, peak_b, dev_f, dev_b;
	double heap_f, heap_b;
};

static int contender_open(rmoe_ctx *ctx, const struct rmoe_problem *prob, enum rmoe_dispatch d, int64_t repeat,
                          struct contender *c)
{
	*c = (struct contender){.d = d};
	struct rmoe_layer_config cfg = prob->cfg;
	cfg.dispatch = d;
	/* Beside the others, each takes the knobs that apply to it: the
	 * partitions are the rings' hops; the cap chunks the rings' hops and
	 * a2a's blocks; whole blocks take no chunks. */
	const struct rmoe_dispatcher *row = rmoe_dispatcher_of(d);
	if (row->family == RMOE_FAMILY_ALLTOALL)
		cfg.partitions = 1;
	if (!row->capped)
		cfg.mem_cap = 0;
	if (row->whole_blocks)
		cfg.chunk_rows = 0;
	int rc = rmoe_layer_create(&c->layer, ctx, &cfg);
	if (rc) {
		rmoe_app_error("%s", rmoe_strerror(rc));
		return rc;
	}
	if (row->family == RMOE_FAMILY_CHOICE) {
		c->d = rmoe_layer_dispatch(c->layer);
		rmoe_app_say("dispatch auto: %s (%s)\n", rmoe_dispatch_name(c->d), rmoe_layer_dispatch_reason(c->layer));
	}
	c->fw = calloc((size_t)repeat, sizeof(double));
	c->bw = calloc((size_t)repeat, sizeof(double));
	rc = rmoe_app_agree(c->fw && c->bw ? 0 : RMOE_ENOMEM);
	return rc ? rc : rmoe_app_agree(rmoe_problem_apply(prob, c->layer));
}

/* One forward and backward (it < 0: the warm-up), on the device's
 * activations when io is set. */
static int contender_pass(struct contender *c, const struct rmoe_problem *prob, const struct rmoe_device_io *io,
                          struct rmoe_results *res, int64_t it, int quiet)
{
	int rc = io ? rmoe_layer_forward_raw(c->layer, RMOE_MEMORY_DEVICE, io->x, io->y)
	            : rmoe_layer_forward(c->layer, prob->x, res->y);
	if (!rc)
		rc = io ? rmoe_layer_backward_raw(c->layer, RMOE_MEMORY_DEVICE, io->dy, NULL, io->dx)
		        : rmoe_layer_backward(c->layer, prob->dy, res->dx);
	if (rc) {
		rmoe_app_error("%s %s", rmoe_dispatch_name(c->d), rmoe_strerror(rc));
		return rc;
	}
	struct rmoe_layer_stats *st = &c->st;
	rmoe_layer_get_stats(c->layer, st);
	if (it >= 0) {
		c->fw[it] = st->forward_seconds * 1e3;
		c->bw[it] = st->backward_seconds * 1e3;
	}
	c->peak_f = fmax(c->peak_f, (double)st->peak_forward_bytes);
	c->peak_b = fmax(c->peak_b, (double)st->peak_backward_bytes);
	c->dev_f = fmax(c->dev_f, (double)st->peak_device_forward_bytes);
	c->dev_b = fmax(c->dev_b, (double)st->peak_device_backward_bytes);
	c->heap_f = fmax(c->heap_f, (double)st->peak_heap_forward_bytes);
	c->heap_b = fmax(c->heap_b, (double)st->peak_heap_backward_bytes);
	if (!quiet)
		rmoe_app_say("  %-5s %s: forward %.1f ms, backward %.1f ms\n", rmoe_dispatch_name(c->d),
		             it < 0 ? "warm-up" : "run", st->forward_seconds * 1e3, st->backward_seconds * 1e3);
	return 0;
}

/* The median and range of v[0..n) into m, lo, hi (v is sorted). */
static void spread(double *v, int64_t n, double *m, double *lo, double *hi)
{
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	*m = v[n / 2];
	*lo = v[0];
	*hi = v[n - 1];
}

/* What one contender measured, into out; first: the run's first
 * dispatcher (the ring), whose time the ratios divide. */
static void contender_outcome(struct contender *c, const struct contender *first, const struct rmoe_problem *prob,
                              const struct rmoe_results *res, int64_t repeat, struct outcome *out)
{
	double *fb = calloc((size_t)repeat, sizeof(double)), *ratio = calloc((size_t)repeat, sizeof(double));
	for (int64_t i = 0; fb && ratio && i < repeat; i++) {
		/* per repetition, the slowest rank; the ratio within one repetition */
		fb[i] = max_over_ranks(c->fw[i] + c->bw[i]);
		ratio[i] = fb[i] / max_over_ranks(first->fw[i] + first->bw[i]);
	}
	if (fb && ratio) {
		spread(fb, repeat, &out->fb_med, &out->fb_min, &out->fb_max);
		spread(ratio, repeat, &out->ratio_med, &out->ratio_min, &out->ratio_max);
	}
	free(fb);
	free(ratio);
	qsort(c->fw, (size_t)repeat, sizeof(double), cmp_double);
	qsort(c->bw, (size_t)repeat, sizeof(double), cmp_double);
	out->d = c->d;
	out->fwd_ms = max_over_ranks(c->fw[repeat / 2]);
	out->bwd_ms = max_over_ranks(c->bw[repeat / 2]);
	out->peak_fwd = max_over_ranks(c->peak_f);
	out->peak_bwd = max_over_ranks(c->peak_b);
	out->resident = max_over_ranks((double)c->st.resident_bytes);
	out->rss = max_over_ranks((double)c->st.peak_rss_bytes);
	out->sent = max_over_ranks((double)(c->st.bytes_sent_forward + c->st.bytes_sent_backward));
	out->sent_fwd = max_over_ranks((double)c->st.bytes_sent_forward);
	out->sent_bwd = max_over_ranks((double)c->st.bytes_sent_backward);
	out->largest_temp = max_over_ranks((double)c->st.largest_temporary_bytes);
	out->chunk_rows = c->st.chunk_rows;
	out->device_fwd = max_over_ranks(c->dev_f);
	out->device_bwd = max_over_ranks(c->dev_b);
	out->heap_fwd = max_over_ranks(c->heap_f);
	out->heap_bwd = max_over_ranks(c->heap_b);
	out->runtime_fwd = max_over_ranks((double)c->st.runtime_forward_bytes);
	out->runtime_bwd = max_over_ranks((double)c->st.runtime_backward_bytes);
	double skew_ring = 1.0, skew_a2a = 1.0;
	/* Simulated: no output exists, the routing is the synthetic uniform one
	 * (skew 1) and no task sampled memory: the peaks are the model's. */
	if (!RMOE_SIMULATED)
		rmoe_problem_routing_skew(prob, res->topk_idx, &skew_ring, &skew_a2a);
	/* a2a's chunks are blocks of one rank's pairs for one partition, as a
	 * ring hop's rows; a2a-megatron holds the busiest rank's rows. */
	const struct rmoe_dispatcher *row = rmoe_dispatcher_of(c->d);
	out->skew = row->rank_rows ? skew_a2a : skew_ring;
	int64_t *blocks = NULL;
	if (!RMOE_SIMULATED && row->routing_blocks)
		blocks = rmoe_problem_a2a_blocks(prob, res->topk_idx);
	model_peaks(prob, out, blocks);
	free(blocks);
	if (RMOE_SIMULATED) {
		out->peak_fwd = out->model_fwd;
		out->peak_bwd = out->model_bwd;
	}
}

/* Every dispatcher of the run, their repetitions interleaved: repetition
 * by repetition each dispatcher runs once, the order rotating, so all see
 * the same machine (a shared machine's load drifts) and none always runs
 * first. Each keeps its own layer; a pass's peak counts only its own
 * layer's data above what was allocated when it started, but the process's
 * RSS and a device's memory hold every dispatcher's layer: measure device
 * memory one dispatcher per process. */
static int run_all(rmoe_ctx *ctx, const struct rmoe_problem *prob, const enum rmoe_dispatch *which, int n,
                   const struct run_opts *r, struct rmoe_results *res, struct outcome *out)
{
	struct contender c[MAX_DISPATCHERS];
	memset(c, 0, sizeof(c));
	int rc = 0;
	for (int i = 0; i < n && !rc; i++)
		rc = contender_open(ctx, prob, which[i], r->repeat, &c[i]);
	/* --io device: the activations stay on the device (device_io.c). */
	struct rmoe_device_io dio = {0}, *io = NULL;
	if (!rc && !strcmp(r->io, "device")) {
		rc = rmoe_device_io_open(ctx, prob, &dio);
		if (rc)
			rmoe_app_error("--io device: %s", rmoe_strerror(rc));
		rc = rmoe_app_agree(rc);
		io = rc ? NULL : &dio;
	}
	/* The layer's calls agree on their outcome by themselves (and end the
	 * process when a peer is lost, from rmoe_app_agree below): no
	 * collective of the program's own may run between passes, where a
	 * rank whose peer is gone would wait in it without bound. */
	for (int64_t it = -1; it < r->repeat && !rc; it++)
		for (int k = 0; k < n && !rc; k++) {
			const int i = (int)((k + it + 1) % n);
			rc = contender_pass(&c[i], prob, io, &res[i], it, r->quiet);
			/* the device's y and dx of this dispatcher's last pass */
			if (!rc && io && it == r->repeat - 1)
				rc = rmoe_app_agree(rmoe_device_io_read(io, prob, &res[i]));
		}
	rc = rmoe_app_agree(rc);
	if (io)
		rmoe_device_io_close(io);
	for (int i = 0; i < n && !rc; i++) {
		if (!RMOE_SIMULATED)
			rc = rmoe_app_agree(rmoe_results_collect(&res[i], prob, c[i].layer));
		if (!rc)
			contender_outcome(&c[i], &c[0], prob, &res[i], r->repeat, &out[i]);
	}
	for (int i = 0; i < n; i++) {
		free(c[i].fw);
		free(c[i].bw);
		if (c[i].layer)
			rmoe_layer_destroy(c[i].layer);
	}
	return rc;
}

static const double MiB = 1024.0 * 1024.0;

/* One row of the table; with a device, its peak (fwd/bwd) at the end. */
/* The headline memory metric, fixed before measuring (docs/memory.md): the
 * total peak of a pass, the larger of StarPU's figure and the heap figure,
 * the larger pass. Simulated runs have no heap figure: StarPU's (the
 * model's) alone. */
static double total_peak(const struct outcome *o)
{
	return fmax(fmax(o->peak_fwd, o->peak_bwd), fmax(o->heap_fwd, o->heap_bwd));
}

static void print_outcome(const struct outcome *o, int device)
{
	double peak = total_peak(o);
	char dev[48] = "";
	if (device)
		snprintf(dev, sizeof(dev), " %9.1f %9.1f", o->device_fwd / MiB, o->device_bwd / MiB);
	rmoe_app_say("%-12s %9.1f %9.1f %11.1f %11.1f %9.1f %9.1f %10.1f %11.1f %9.1f %9.1f%s\n",
	             rmoe_dispatch_name(o->d), o->fwd_ms, o->bwd_ms, o->peak_fwd / MiB, o->peak_bwd / MiB,
	             o->heap_fwd / MiB, o->heap_bwd / MiB, peak / MiB, (peak - o->resident) / MiB, o->rss / MiB,
	             o->sent / MiB, dev);
}

/* What the run ran on (this rank's context), for the record of every row. */
static struct {
	const char *sched, *starpu;
	int cpu_workers, cuda_workers;
} run_info;

/* What the device columns count (codelets/probe.c): kept, StarPU's cache
 * of freed device buffers included; off, the bytes the data held. */
static const char *device_cache_mode(void)
{
	const char *env = getenv("RMOE_DEVICE_CACHE");
	return env && !strcmp(env, "off") ? "off" : "kept";
}

static int write_csv(const char *path, const struct rmoe_layer_config *cfg, int nranks,
                     const struct outcome *o, int n, const char *io)
{
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (rank != 0)
		return 0;
	FILE *f = fopen(path, "a");
	if (!f) {
		rmoe_app_error("--csv %s: cannot open for appending", path);
		return RMOE_EIO;
	}
	if (ftell(f) == 0)
		fprintf(f, "dispatch,ranks,hidden,ffn,experts,topk,tokens,chunk_rows,fwd_ms,bwd_ms,"
		           "peak_fwd_bytes,peak_bwd_bytes,resident_bytes,peak_rss_bytes,sent_bytes,"
		           "largest_temp_bytes,skew,model_peak_fwd_bytes,model_peak_bwd_bytes,dtype,partitions,"
		           "peak_device_fwd_bytes,peak_device_bwd_bytes,sched,cpu_workers,cuda_workers,starpu,io,"
		           "fwd_bwd_min_ms,fwd_bwd_max_ms,time_vs_first_median,time_vs_first_min,time_vs_first_max,"
		           "fwd_bwd_median_ms,heap_fwd_bytes,heap_bwd_bytes,device_cache,"
		           "model_leaving_fwd_bytes,model_leaving_bwd_bytes,sent_fwd_bytes,sent_bwd_bytes,"
		           "runtime_fwd_bytes,runtime_bwd_bytes\n");
	for (int i = 0; i < n; i++)
		fprintf(f, "%s,%d,%lld,%lld,%lld,%lld,%lld,%lld,%.3f,%.3f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.4f,"
		           "%.0f,%.0f,%s,%lld,%.0f,%.0f,%s,%d,%d,%s,%s,%.3f,%.3f,%.4f,%.4f,%.4f,%.3f,%.0f,%.0f,%s,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f\n",
		        rmoe_dispatch_name(o[i].d), nranks, (long long)cfg->hidden, (long long)cfg->ffn,
		        (long long)cfg->experts, (long long)cfg->topk, (long long)cfg->tokens,
		        (long long)o[i].chunk_rows, o[i].fwd_ms, o[i].bwd_ms, o[i].peak_fwd, o[i].peak_bwd,
		        o[i].resident, o[i].rss, o[i].sent, o[i].largest_temp, o[i].skew, o[i].model_fwd,
		        o[i].model_bwd, cfg->dtype == RMOE_DTYPE_BF16 ? "bf16" : "f32",
		        (long long)(cfg->partitions > 1 && !rmoe_dispatch_alltoall(o[i].d) ? cfg->partitions : 1),
		        o[i].device_fwd, o[i].device_bwd, run_info.sched, run_info.cpu_workers, run_info.cuda_workers,
		        run_info.starpu, io, o[i].fb_min, o[i].fb_max, o[i].ratio_med, o[i].ratio_min, o[i].ratio_max,
		        o[i].fb_med, o[i].heap_fwd, o[i].heap_bwd, device_cache_mode(), o[i].leave_fwd, o[i].leave_bwd,
		        o[i].sent_fwd, o[i].sent_bwd, o[i].runtime_fwd, o[i].runtime_bwd);
	return fclose(f) == 0 ? 0 : RMOE_EIO;
}

/* --routing: the pairs of each rank's tokens routed to each expert, as the
 * expert GEMMs see them (rank r's rows of expert e form one GEMM per
 * matrix): "rank,expert,rows", one line per rank and expert. The routing
 * is that of the run's last pass; every dispatcher routes alike. Written to
 * a temporary name and renamed: no partial file. */
static int write_routing(const char *path, const struct rmoe_problem *p, const int32_t *topk_idx)
{
	const int64_t E = p->cfg.experts, P = p->cfg.tokens * p->cfg.topk;
	int64_t *mine = calloc((size_t)E, sizeof(int64_t));
	int64_t *all = p->rank == 0 ? calloc((size_t)(E * p->nranks), sizeof(int64_t)) : NULL;
	int rc = mine && (p->rank != 0 || all) ? 0 : RMOE_ENOMEM;
	for (int64_t i = 0; i < P && !rc; i++)
		mine[topk_idx[i]]++;
	if (rmoe_app_agree(rc)) {
		free(mine);
		free(all);
		rmoe_app_error("--routing %s: out of memory", path);
		return RMOE_ENOMEM;
	}
	MPI_Gather(mine, (int)E, MPI_INT64_T, all, (int)E, MPI_INT64_T, 0, MPI_COMM_WORLD);
	if (p->rank == 0) {
		char tmp[4096];
		snprintf(tmp, sizeof(tmp), "%s.tmp%ld", path, (long)getpid());
		FILE *f = fopen(tmp, "w");
		rc = f ? 0 : RMOE_EIO;
		if (f) {
			fprintf(f, "rank,expert,rows\n");
			for (int r = 0; r < p->nranks; r++)
				for (int64_t e = 0; e < E; e++)
					fprintf(f, "%d,%lld,%lld\n", r, (long long)e, (long long)all[r * E + e]);
			rc = fclose(f) == 0 && rename(tmp, path) == 0 ? 0 : RMOE_EIO;
			if (rc)
				remove(tmp);
		}
		if (rc)
			rmoe_app_error("--routing %s: cannot write it", path);
	}
	free(mine);
	free(all);
	return rc;
}

/* The context, with the trace and scheduler settings of the options. */
static int make_context(const struct run_opts *r, rmoe_ctx **ctx)
{
	struct rmoe_ctx_config ccfg;
	rmoe_ctx_config_init(&ccfg);
	ccfg.trace = r->trace;
	ccfg.verbose = r->verbose;
	ccfg.ring_order = strcmp(r->ring.ring_order, "rank") ? RMOE_RING_PLANNED : RMOE_RING_RANK;
	ccfg.blas_threads = (int)r->blas_threads;
	if (r->sched) {
		/* STARPU_SCHED would win over the configuration's policy. */
		setenv("STARPU_SCHED", r->sched, 1);
		ccfg.sched = r->sched;
	}
	if (r->no_prio) {
		/* The ring's tasks all clamp to one level (tasks given no priority
		 * stay at 0), and StarPU-MPI sends in submission order. Not min =
		 * max: dmda-family policies divide by max - min. */
		setenv("STARPU_MIN_PRIO", "0", 1);
		setenv("STARPU_MAX_PRIO", "1", 1);
		setenv("STARPU_MPI_PRIORITIES", "0", 1);
	}
	int rc = rmoe_app_agree(rmoe_ctx_create(ctx, &ccfg));
	if (rc) {
		rmoe_app_error("%s", rmoe_strerror(rc));
		if (*ctx)
			rmoe_ctx_destroy(*ctx);
		*ctx = NULL;
		return rc;
	}
	/* The order every ring of the run uses, to set beside relaymoe plan's.
	 * One write for the line: flushed pieces would interleave with other
	 * ranks' messages in mpirun's output. */
	int n = rmoe_ctx_size(*ctx), *order = malloc(sizeof(int) * (size_t)n);
	size_t cap = 12 * (size_t)n + 1;
	char *line = malloc(cap);
	if (order && line && rmoe_ctx_ring_order(*ctx, order) == 0) {
		size_t used = 0;
		line[0] = '\0';
		for (int i = 0; i < n && used < cap; i++)
			used += (size_t)snprintf(line + used, cap - used, " %d", order[i]);
		rmoe_app_say("ring order (%s):%s\n", r->ring.ring_order, line);
	}
	free(line);
	free(order);
	return 0;
}

/* The comparison printed after the table: each all-to-all baseline over
 * each ring mode, the model against the measured peaks, the dispatchers
 * against each other. */
static void print_comparisons(const struct outcome *out, const struct rmoe_results *res, int ndisp,
                              const struct rmoe_problem *prob)
{
	for (int ia = 0; ia < ndisp; ia++) {
		if (!rmoe_dispatch_alltoall(out[ia].d))
			continue;
		for (int i = 0; i < ndisp; i++) {
			if (rmoe_dispatch_alltoall(out[i].d))
				continue;
			const struct outcome *ring = &out[i], *a2a = &out[ia];
			double pr = total_peak(ring), pa = total_peak(a2a);
			char t[96];
			/* against the first dispatcher: the ratio of each repetition */
			if (i == 0)
				snprintf(t, sizeof(t), "%.2fx [%.2f-%.2f] (median, range of the repetitions)", a2a->ratio_med,
				         a2a->ratio_min, a2a->ratio_max);
			else
				snprintf(t, sizeof(t), "%.2fx (of the medians)", a2a->fb_med / ring->fb_med);
			rmoe_app_say("%s/%s: total peak %.2fx, forward+backward time %s\n", rmoe_dispatch_name(a2a->d),
			             rmoe_dispatch_name(ring->d), pa / pr, t);
			/* Diagnostics, never the headline: each figure alone, and the
			 * execution peak (the total above the resident part). */
			double ha = fmax(a2a->heap_fwd, a2a->heap_bwd), hr = fmax(ring->heap_fwd, ring->heap_bwd);
			char heap[48] = "";
			if (ha > 0 && hr > 0)
				snprintf(heap, sizeof(heap), ", heap figure %.2fx", ha / hr);
			rmoe_app_say("  (diagnostics, %s/%s: StarPU's figure %.2fx%s, execution peak %.2fx)\n",
			             rmoe_dispatch_name(a2a->d), rmoe_dispatch_name(ring->d),
			             fmax(a2a->peak_fwd, a2a->peak_bwd) / fmax(ring->peak_fwd, ring->peak_bwd), heap,
			             (pa - a2a->resident) / (pr - ring->resident));
		}
	}
	for (int i = 0; i < ndisp; i++)
		rmoe_app_say("%-12s forward+backward %.1f ms [%.1f-%.1f] over the interleaved repetitions\n",
		             rmoe_dispatch_name(out[i].d), out[i].fb_med, out[i].fb_min, out[i].fb_max);
	for (int i = 0; i < ndisp && !RMOE_SIMULATED; i++)
		rmoe_app_say("model %-12s (routing skew %.3f): peak fwd %.1f MiB (%+.1f%%), bwd %.1f MiB (%+.1f%%) "
		             "against the measured\n",
		             rmoe_dispatch_name(out[i].d), out[i].skew, out[i].model_fwd / MiB,
		             100.0 * (out[i].model_fwd / out[i].peak_fwd - 1.0), out[i].model_bwd / MiB,
		             100.0 * (out[i].model_bwd / out[i].peak_bwd - 1.0));
	/* The model against the independent figure, with the runtime's
	 * structures the heap holds beside the data (the graph's handles,
	 * tasks and requests): what neither counts (scratch, MPI's buffers,
	 * slack) shows here. */
	for (int i = 0; i < ndisp && !RMOE_SIMULATED; i++)
		rmoe_app_say("model %-12s + runtime %.1f/%.1f MiB against the heap: fwd %.1f MiB (model %+.1f%%), "
		             "bwd %.1f MiB (model %+.1f%%)\n",
		             rmoe_dispatch_name(out[i].d), out[i].runtime_fwd / MiB, out[i].runtime_bwd / MiB,
		             out[i].heap_fwd / MiB, 100.0 * ((out[i].model_fwd + out[i].runtime_fwd) / out[i].heap_fwd - 1.0),
		             out[i].heap_bwd / MiB, 100.0 * ((out[i].model_bwd + out[i].runtime_bwd) / out[i].heap_bwd - 1.0));
	for (int i = 1; i < ndisp && !RMOE_SIMULATED; i++) {
		const char *worst;
		double diff = rmoe_results_max_rel_diff(&res[0], &res[i], prob, &worst);
		rmoe_app_say("largest relative difference %s vs %s: %.2e (%s)\n", rmoe_dispatch_name(out[0].d),
		             rmoe_dispatch_name(out[i].d), diff, worst);
	}
}

/* The table and what follows it; --check, --dump and --csv. Returns the
 * exit code. */
static int report(const struct run_opts *r, const struct rmoe_layer_config *cfg, const struct outcome *out,
                  const struct rmoe_results *res, int ndisp, const struct rmoe_problem *prob)
{
	int exit_code = 0;
	int device = 0;
	for (int i = 0; i < ndisp; i++)
		device |= out[i].device_fwd > 0 || out[i].device_bwd > 0;
	rmoe_app_say("\n%-12s %9s %9s %11s %11s %9s %9s %10s %11s %9s %9s%s\n", "", "fwd ms", "bwd ms", "peak fwd",
	             "peak bwd", "heap fwd", "heap bwd", "TOTAL", "exec peak", "peak RSS", "sent",
	             device ? "  dev fwd   dev bwd" : "");
	rmoe_app_say("%-12s %9s %9s %11s %11s %9s %9s %10s %11s %9s %9s%s\n", "", "(median)", "(median)", "MiB", "MiB",
	             "MiB", "MiB", "MiB", "(diag) MiB", "MiB", "MiB/rank", device ? "       MiB       MiB" : "");
	for (int i = 0; i < ndisp; i++)
		print_outcome(&out[i], device);
	for (int i = 0; i < ndisp; i++)
		if (cfg->mem_cap > 0 && rmoe_dispatcher_of(out[i].d)->capped)
			rmoe_app_say("%s: memory cap %.3f MiB -> %s in chunks of %lld rows; measured peak %.3f MiB\n",
			             rmoe_dispatch_name(out[i].d), (double)cfg->mem_cap / MiB, rmoe_dispatcher_of(out[i].d)->chunked,
			             (long long)out[i].chunk_rows, fmax(out[i].peak_fwd, out[i].peak_bwd) / MiB);
#ifdef RMOE_SIMGRID
	rmoe_app_say("(simulated: times are SimGrid's simulated time, max over ranks; peak = the memory model's "
	             "(model), no task samples memory in a simulation, TOTAL = its larger pass; exec peak = a "
	             "diagnostic, TOTAL above the %.1f MiB resident; peak RSS is the simulator's whole process)\n",
	             out[0].resident / MiB);
#else
	rmoe_app_say("(max over ranks; peak = the layer's StarPU data, sampled at every task; heap = the same "
	             "resident part plus the process heap's growth (malloc'ed, whoever by), sampled at every task and "
	             "every 0.5 ms; TOTAL = the headline metric, the larger of peak and heap over both passes; exec "
	             "peak = a diagnostic, TOTAL above the %.1f MiB resident: weights, gradients, inputs, routing; "
	             "peak RSS: the process, which holds every dispatcher's layer)\n",
	             out[0].resident / MiB);
	if (device)
		rmoe_app_say("(dev = StarPU's bytes on the GPU, weights and inputs there included, %s)\n",
		             strcmp(device_cache_mode(), "off")
		                     ? "its cache of freed device buffers too (RMOE_DEVICE_CACHE=off: the data's own)"
		                     : "freed buffers returned at once (RMOE_DEVICE_CACHE=off): the data's own");
#endif
	print_comparisons(out, res, ndisp, prob);
	const double tol = cfg->dtype == RMOE_DTYPE_BF16 ? CHECK_TOLERANCE_BF16 : CHECK_TOLERANCE_F32;
	for (int i = 0; i < ndisp && r->check; i++) {
		const char *worst;
		int64_t ties;
		double err = rmoe_results_check(&res[i], prob, &worst, &ties);
		int ok = err <= tol;
		rmoe_app_say("check %s vs reference: largest relative error %.2e (%s), %lld near-tie routing "
		             "choice(s); tolerance %.0e: %s\n",
		             rmoe_dispatch_name(out[i].d), err, worst, (long long)ties, tol, ok ? "PASS" : "FAIL");
		if (!ok)
			exit_code = 1;
	}
	if (exit_code == 0 && r->dump) {
		if (rmoe_results_dump(&res[0], prob, r->dump))
			exit_code = 1;
		else
			rmoe_app_say("wrote inputs and %s outputs to %s/\n", rmoe_dispatch_name(out[0].d), r->dump);
	}
	if (exit_code == 0 && r->csv && rmoe_app_agree(write_csv(r->csv, cfg, prob->nranks, out, ndisp, r->io)))
		exit_code = 1;
	if (exit_code == 0 && r->routing && rmoe_app_agree(write_routing(r->routing, prob, res[0].topk_idx)))
		exit_code = 1;
	return exit_code;
}

int rmoe_cmd_run(int argc, char **argv, int first)
{
	struct run_opts r = {.preset.scale = 1.0, .ring = {.dtype = "f32", .ring_order = "planned"}, .seed = 1,
	                     .repeat = 3, .partitions = 1, .dispatch = "baselines", .io = "host"};
	char msg[1024];
	int prc = parse_options(&r, argc, argv, first, msg, sizeof(msg));
	if (prc == 1)
		return 0;
	struct rmoe_layer_config cfg;
	enum rmoe_dispatch which[MAX_DISPATCHERS];
	int ndisp = 0;
	if (!prc)
		prc = make_config(&r, &cfg, msg, sizeof(msg));
	if (!prc && !(ndisp = rmoe_app_dispatch_list(r.dispatch, which, msg, sizeof(msg))))
		prc = RMOE_EINVAL;
	/* Beside others, whole blocks run whole while the others are chunked
	 * (contender_open); asked for alone, the knobs are refused. */
	const struct rmoe_dispatcher *alone = !prc && ndisp == 1 ? rmoe_dispatcher_of(which[0]) : NULL;
	if (alone && alone->whole_blocks && (cfg.chunk_rows > 0 || cfg.mem_cap > 0)) {
		snprintf(msg, sizeof(msg), "%s: %s sends whole per-rank blocks (they apply to the rings and a2a)",
		         cfg.chunk_rows > 0 ? "--chunk-rows" : "--mem-cap", alone->name);
		prc = RMOE_EINVAL;
	}
#ifdef RMOE_SIMGRID
	if (!prc && (r.check || r.load || r.dump || r.trace || r.routing)) {
		snprintf(msg, sizeof(msg), "--check, --load, --dump, --trace and --routing need real kernels: this is the "
		         "simulation build (StarPU-SimGrid)");
		prc = RMOE_EINVAL;
	}
#endif
	int nranks;
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	/* The configuration is checked before anything starts (same check as
	 * the layer's, so a bad value fails here on every rank alike). */
	if (!prc && (prc = rmoe_config_check(&cfg, nranks)))
		snprintf(msg, sizeof(msg), "%s", rmoe_strerror(prc));
	if (prc) {
		rmoe_app_say("relaymoe run: %s\n", msg);
		return 2;
	}
	rmoe_ctx *ctx = NULL;
	if (make_context(&r, &ctx))
		return 1;
	run_info.sched = rmoe_ctx_sched_policy(ctx);
	run_info.starpu = rmoe_starpu_build();
	rmoe_ctx_workers(ctx, &run_info.cpu_workers, &run_info.cuda_workers);
	struct rmoe_problem prob;
	if (rmoe_problem_init(&prob, &cfg, (uint64_t)r.seed, r.load)) {
		rmoe_problem_free(&prob);
		rmoe_ctx_destroy(ctx);
		return 1;
	}
	rmoe_app_say("relaymoe run: %d rank(s), H=%lld F=%lld E=%lld K=%lld, %lld tokens per rank%s%s, seed %lld, "
	             "%lld timed repetition(s)\n",
	             nranks, (long long)cfg.hidden, (long long)cfg.ffn, (long long)cfg.experts, (long long)cfg.topk,
	             (long long)cfg.tokens, r.preset.preset ? ", preset " : "", r.preset.preset ? r.preset.preset : "",
	             (long long)r.seed, (long long)r.repeat);
	char routing[160];
	rmoe_app_routing_line(&cfg, routing, sizeof(routing));
	rmoe_app_say("  routing: %s\n", routing);
	if (r.preset.preset && r.preset.scale != 1.0)
		rmoe_app_say("  (H, F and tokens of %s divided by %g)\n", r.preset.preset, r.preset.scale);
	rmoe_app_say("  StarPU %s, policy %s, %d CPU and %d CUDA worker(s) per rank, %d OpenBLAS thread(s) per call "
	             "(%s kernels), %s, activations on the %s\n",
	             run_info.starpu, run_info.sched, run_info.cpu_workers, run_info.cuda_workers,
	             rmoe_ctx_blas_threads(ctx), rmoe_blas_core(), cfg.dtype == RMOE_DTYPE_BF16 ? "bf16" : "f32", r.io);

	struct rmoe_results res[MAX_DISPATCHERS];
	struct outcome out[MAX_DISPATCHERS];
	memset(res, 0, sizeof(res));
	int rc = 0;
	for (int i = 0; i < ndisp && !rc; i++)
		rc = rmoe_app_agree(rmoe_results_alloc(&res[i], &prob));
	if (!rc)
		rc = run_all(ctx, &prob, which, ndisp, &r, res, out);
	int exit_code = rc ? 1 : report(&r, &cfg, out, res, ndisp, &prob);
	for (int i = 0; i < MAX_DISPATCHERS; i++)
		rmoe_results_free(&res[i]);
	rmoe_problem_free(&prob);
	/* With --trace, destroying the context converts the trace on rank 0. */
	int drc = rmoe_ctx_destroy(ctx);
	if (drc) {
		rmoe_app_error("%s", rmoe_strerror(drc));
		exit_code = 1;
	} else if (r.trace && exit_code == 0) {
		rmoe_app_say("trace of %d rank(s) in %s/ (paje.trace, tasks.rec, dag.dot, relaymoe-trace.txt)\n", nranks,
		             r.trace);
	}
	return exit_code;
}
