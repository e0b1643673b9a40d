/* relaymoe run: one MoE layer, forward and backward, with the ring and the
 * all-to-all dispatchers side by side on the same inputs and weights: the
 * options, the dispatchers' passes interleaved, and what each measured,
 * agreed over the ranks (run_report.c prints it). */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "device_io.h"
#include "messages.h"
#include "options.h"
#include "problem.h"
#include "results.h"
#include "rmoe_config.h"
#include "rmoe_memory_model.h"
#include "rmoe_scheduler.h"
#include "run_report.h"

struct run_opts {
	struct rmoe_preset_opts preset;
	struct rmoe_shape_opts shape;
	struct rmoe_ring_opts ring;
	int64_t seed, repeat, partitions;
	int64_t blas_threads;           /* 0: the context's automatic count */
	int64_t ranks_per_node;         /* emulated nodes; 0: by host */
	const char *dispatch, *load, *dump, *csv, *io, *routing;
	const char *tokens_per_rank;    /* NULL: --tokens on every rank */
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
	".npy layout (float32, C order): x.npy, dy.npy [N*T, H] (rank r: rows r*T..; with\n"
	"--tokens-per-rank, [T0+..+T(N-1), H], rank r's rows after those of ranks below it);\n"
	"w_router.npy [H, E]; w_gate.npy, w_up.npy [E, H, F]; w_down.npy [E, F, H];\n"
	"with --shared-ffn FS w_shared_gate.npy, w_shared_up.npy [H, FS], w_shared_down.npy\n"
	"[FS, H], and with --shared-gated w_shared_expert_gate.npy [H];\n"
	"outputs y, dx, dw_router (summed over ranks), dw_gate, dw_up, dw_down alike,\n"
	"dw_shared_* and dw_shared_expert_gate (summed over ranks).\n"
	"--dump writes the inputs too, and the outputs of the first dispatcher run.\n";

/* The options of relaymoe run, set by set, into r: as rmoe_app_options. */
static int parse_options(struct run_opts *r, int argc, char **argv, int first, char *msg, size_t len)
{
	const struct rmoe_opt shape[] = {
		RMOE_PRESET_OPTIONS(&r->preset),
		RMOE_SHAPE_OPTIONS(&r->shape),
		{"tokens-per-rank", RMOE_OPT_STRING, &r->tokens_per_rank, 0, 0, "T0,T1,...", "instead of --tokens, each rank's own count, one per rank, each >= 0 (the layer is sized for the largest)", NULL},
	};
	const struct rmoe_opt layer[] = {
		RMOE_RING_OPTIONS(&r->ring),
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
		{"ranks-per-node", RMOE_OPT_INT, &r->ranks_per_node, 0, 1e6, "R", "group consecutive ranks, R at a time, into nodes whatever their hosts (several nodes on one machine; 0: by host)", NULL},
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
	cfg->check_finite = r->check_finite;
	cfg->deterministic = r->deterministic;
	cfg->partitions = r->partitions;
	if (strcmp(r->io, "host") && strcmp(r->io, "device")) {
		snprintf(msg, len, "--io '%s': expected host or device", r->io);
		return RMOE_EINVAL;
	}
	return 0;
}

/* blocks: a2a's, the routing seen (NULL: the skew's bound). */
static void model_peaks(const struct rmoe_problem *p, struct rmoe_run_outcome *o, const int64_t *blocks)
{
	struct rmoe_mem_config mc;
	/* Each rank with its own count, the kept buffers at the capacity. */
	rmoe_mem_config_from_layer(&mc, &p->cfg, p->nranks);
	mc.rank_tokens = p->rank_tokens;
	mc.capacity = p->cfg.tokens;
	mc.chunk_rows = o->chunk_rows;
	mc.stripes = o->stripes;
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
	if (!row->striped)
		cfg.stripes = 0;
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
                              const struct rmoe_results *res, int64_t repeat, struct rmoe_run_outcome *out)
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
	out->stripes = rmoe_layer_stripes(c->layer);
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
                   const struct run_opts *r, struct rmoe_results *res, struct rmoe_run_outcome *out)
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

/* The context, with the trace and scheduler settings of the options. */
static int make_context(const struct run_opts *r, rmoe_ctx **ctx)
{
	struct rmoe_ctx_config ccfg;
	rmoe_ctx_config_init(&ccfg);
	ccfg.trace = r->trace;
	ccfg.verbose = r->verbose;
	ccfg.ring_order = strcmp(r->ring.ring_order, "rank") ? RMOE_RING_PLANNED : RMOE_RING_RANK;
	ccfg.blas_threads = (int)r->blas_threads;
	ccfg.ranks_per_node = (int)r->ranks_per_node;
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

/* The run's options, the layer's configuration and the dispatchers, all
 * checked before anything starts (the layer's own check, so a bad value
 * fails here on every rank alike); 0, 1 after --help, or a negative
 * RMOE_E* code with msg. */
static int configure(struct run_opts *r, int argc, char **argv, int first, struct rmoe_layer_config *cfg,
                     int64_t *rank_tokens, enum rmoe_dispatch *which, int *ndisp, char *msg, size_t len)
{
	int nranks;
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	int prc = parse_options(r, argc, argv, first, msg, len);
	if (prc)
		return prc;
	prc = make_config(r, cfg, msg, len);
	if (!prc && r->tokens_per_rank && r->shape.g_tokens) {
		snprintf(msg, len, "--tokens and --tokens-per-rank both given: expected one way to say tokens per rank");
		prc = RMOE_EINVAL;
	}
	/* The layer is sized for the largest count, its capacity. */
	if (!prc && r->tokens_per_rank)
		prc = rmoe_app_rank_tokens(r->tokens_per_rank, nranks, rank_tokens, &cfg->tokens, msg, len);
	if (!prc && !(*ndisp = rmoe_app_dispatch_list(r->dispatch, which, msg, len)))
		prc = RMOE_EINVAL;
	/* Beside others, whole blocks run whole while the others are chunked
	 * (contender_open); asked for alone, the knobs are refused. */
	const struct rmoe_dispatcher *alone = !prc && *ndisp == 1 ? rmoe_dispatcher_of(which[0]) : NULL;
	if (alone && alone->whole_blocks && (cfg->chunk_rows > 0 || cfg->mem_cap > 0)) {
		snprintf(msg, len, "%s: %s sends whole per-rank blocks (they apply to the rings and a2a)",
		         cfg->chunk_rows > 0 ? "--chunk-rows" : "--mem-cap", alone->name);
		prc = RMOE_EINVAL;
	}
#ifdef RMOE_SIMGRID
	if (!prc && (r->check || r->load || r->dump || r->trace || r->routing)) {
		snprintf(msg, len, "--check, --load, --dump, --trace and --routing need real kernels: this is the "
		         "simulation build (StarPU-SimGrid)");
		prc = RMOE_EINVAL;
	}
#endif
	if (!prc && (prc = rmoe_config_check(cfg, nranks)))
		snprintf(msg, len, "%s", rmoe_strerror(prc));
	return prc;
}

/* The tokens of the header line: "3072 tokens per rank", or with
 * --tokens-per-rank each rank's, "tokens per rank 0,100,3072". */
static void tokens_text(const struct run_opts *r, const struct rmoe_problem *p, char *text, size_t len)
{
	if (!r->tokens_per_rank) {
		snprintf(text, len, "%lld tokens per rank", (long long)p->cfg.tokens);
		return;
	}
	size_t used = (size_t)snprintf(text, len, "tokens per rank");
	for (int i = 0; i < p->nranks && used < len; i++)
		used += (size_t)snprintf(text + used, len - used, "%c%lld", i ? ',' : ' ', (long long)p->rank_tokens[i]);
}

/* What the run is: the layer, its routing, the machine it runs on. */
static void print_header(const struct run_opts *r, const struct rmoe_problem *p, rmoe_ctx *ctx,
                         const struct rmoe_run_info *info)
{
	const struct rmoe_layer_config *cfg = &p->cfg;
	/* room for every rank's count */
	const size_t len = 32 + 21 * (size_t)p->nranks;
	char *tokens = malloc(len);
	if (tokens)
		tokens_text(r, p, tokens, len);
	rmoe_app_say("relaymoe run: %d rank(s), H=%lld F=%lld E=%lld K=%lld, %s%s%s, seed %lld, "
	             "%lld timed repetition(s)\n",
	             p->nranks, (long long)cfg->hidden, (long long)cfg->ffn, (long long)cfg->experts,
	             (long long)cfg->topk, tokens ? tokens : "tokens per rank", r->preset.preset ? ", preset " : "",
	             r->preset.preset ? r->preset.preset : "", (long long)r->seed, (long long)r->repeat);
	free(tokens);
	char routing[160];
	rmoe_app_routing_line(cfg, routing, sizeof(routing));
	rmoe_app_say("  routing: %s\n", routing);
	if (r->preset.preset && r->preset.scale != 1.0)
		rmoe_app_say("  (H, F and tokens of %s divided by %g)\n", r->preset.preset, r->preset.scale);
	rmoe_app_say("  StarPU %s, policy %s, %d CPU and %d CUDA worker(s) per rank, %d OpenBLAS thread(s) per call "
	             "(%s kernels), %s, activations on the %s\n",
	             info->starpu, info->sched, info->cpu_workers, info->cuda_workers, rmoe_ctx_blas_threads(ctx),
	             rmoe_blas_core(), cfg->dtype == RMOE_DTYPE_BF16 ? "bf16" : "f32", r->io);
}

int rmoe_cmd_run(int argc, char **argv, int first)
{
	struct run_opts r = {.preset.scale = 1.0, .ring = {.dtype = "f32", .ring_order = "planned"}, .seed = 1,
	                     .repeat = 3, .partitions = 1, .dispatch = "baselines", .io = "host"};
	struct rmoe_layer_config cfg;
	enum rmoe_dispatch which[MAX_DISPATCHERS];
	int ndisp = 0, nranks;
	char msg[1024];
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	int64_t *rank_tokens = calloc((size_t)nranks, sizeof(int64_t));
	if (rmoe_app_agree(rank_tokens ? 0 : RMOE_ENOMEM)) {
		rmoe_app_error("out of host memory");
		free(rank_tokens);
		return 1;
	}
	int prc = configure(&r, argc, argv, first, &cfg, rank_tokens, which, &ndisp, msg, sizeof(msg));
	if (prc) {
		free(rank_tokens);
		if (prc == 1)
			return 0;
		rmoe_app_say("relaymoe run: %s\n", msg);
		return 2;
	}
	rmoe_ctx *ctx = NULL;
	if (make_context(&r, &ctx)) {
		free(rank_tokens);
		return 1;
	}
	struct rmoe_run_info info = {.sched = rmoe_ctx_sched_policy(ctx), .starpu = rmoe_starpu_build()};
	rmoe_ctx_workers(ctx, &info.cpu_workers, &info.cuda_workers);
	struct rmoe_problem prob;
	int irc = rmoe_problem_init_tokens(&prob, &cfg, r.tokens_per_rank ? rank_tokens : NULL, (uint64_t)r.seed, r.load);
	free(rank_tokens);
	if (irc) {
		rmoe_problem_free(&prob);
		rmoe_ctx_destroy(ctx);
		return 1;
	}
	print_header(&r, &prob, ctx, &info);

	struct rmoe_results res[MAX_DISPATCHERS];
	struct rmoe_run_outcome out[MAX_DISPATCHERS];
	memset(res, 0, sizeof(res));
	int rc = 0;
	for (int i = 0; i < ndisp && !rc; i++)
		rc = rmoe_app_agree(rmoe_results_alloc(&res[i], &prob));
	if (!rc)
		rc = run_all(ctx, &prob, which, ndisp, &r, res, out);
	const struct rmoe_run_report rep = {
		.cfg = &cfg, .prob = &prob, .out = out, .res = res, .ndisp = ndisp, .info = info, .check = r.check,
		.io = r.io, .dump = r.dump, .csv = r.csv, .routing = r.routing,
	};
	int exit_code = rc ? 1 : rmoe_run_report(&rep);
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
