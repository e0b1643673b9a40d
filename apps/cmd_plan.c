/* relaymoe plan: the decisions taken before a layer runs, for a model on a
 * cluster: the ring order and its links, per-hop transfer and compute
 * estimates of expert and token routing (Table 2), the chosen mode and why.
 * Runs as one process (MPI singleton) with --ranks, or under mpirun on the
 * live topology. Nothing is printed until the whole plan is made. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "options.h"
#include "rmoe_attn_plan.h"
#include "rmoe_memory_model.h"
#include "rmoe_plan.h"
#include "rmoe_system.h"

struct plan_opts {
	struct rmoe_preset_opts preset;
	struct rmoe_shape_opts shape;
	struct rmoe_ring_opts ring;
	int64_t seq, micro_batch, sp, cp, etp, ranks, budget;
	int64_t layers, heads, kv_heads, head_dim, model_state, dp;
	int attention;
	int shared_gated;
	const char *cluster;
	int json;
	int g_seq, g_mb, g_sp, g_cp, g_ranks;
};

static const char *usage_head =
	"usage: relaymoe plan [options]          (or under mpirun: the live topology)\n"
	"\n"
	"Plans one MoE layer on a cluster: the ring order and the link of each ring\n"
	"edge, per-hop transfer and compute time of expert routing and token routing\n"
	"(paper Table 2), forward and backward, the mode with less exposed\n"
	"communication, and how much of each transfer compute hides.\n"
	"\n";

static const char *usage_tail =
	"\n"
	"Tokens per rank: --tokens T, or --seq S [--micro-batch B --sp SP --cp CP] for\n"
	"T = B*S/(SP*CP); a --preset alone gives the paper's 49152 (divided by --scale).\n"
	"Without a preset or explicit values the shape is relaymoe run's default.\n"
	"Without --cluster the links and device rates are built-in H100-class\n"
	"assumptions (see scheduler/rmoe_plan.h); scheduler/clusters/ has descriptions.\n"
	"--ranks other than the mpirun size simulates the placement: the cluster's\n"
	"rank_nodes, else ranks_per_node ranks per node, else all on this machine.\n";

/* The options of relaymoe plan, set by set, into r: as rmoe_app_options. */
static int parse_options(struct plan_opts *r, int argc, char **argv, int first, char *msg, size_t len)
{
	const struct rmoe_opt shape[] = {RMOE_PRESET_OPTIONS(&r->preset), RMOE_SHAPE_OPTIONS(&r->shape)};
	const struct rmoe_opt layer[] = {
		RMOE_RING_OPTIONS(&r->ring),
		{"shared-gated", RMOE_OPT_FLAG, &r->shared_gated, 0, 0, NULL, "the shared expert is gated, as Qwen2-MoE's (a preset's model decides otherwise)", NULL},
		{"budget", RMOE_OPT_SIZE, &r->budget, 1, 9e18, "BYTES", "memory for the layer (device memory)", NULL},
	};
	const struct rmoe_opt parallel[] = {
		{"seq", RMOE_OPT_INT, &r->seq, 1, RMOE_OPT_MAX_TOKENS, "S", "sequence length", &r->g_seq},
		{"micro-batch", RMOE_OPT_INT, &r->micro_batch, 1, 1e6, "B", "micro-batch size", &r->g_mb},
		{"sp", RMOE_OPT_INT, &r->sp, 1, 1e6, "SP", "sequence parallelism", &r->g_sp},
		{"cp", RMOE_OPT_INT, &r->cp, 1, 1e6, "CP", "context parallelism", &r->g_cp},
		{"etp", RMOE_OPT_INT, &r->etp, 1, 1e6, "ETP", "expert tensor parallelism", NULL},
		{"dp", RMOE_OPT_INT, &r->dp, 1, 1e6, "DP", "data parallelism sharding the optimizer", NULL},
		{"ranks", RMOE_OPT_INT, &r->ranks, 1, RMOE_CLUSTER_MAX_RANKS, "N", "ranks of the ring, EP (mpirun size)", &r->g_ranks},
		{"cluster", RMOE_OPT_STRING, &r->cluster, 0, 0, "FILE", "cluster description (else live topology)", NULL},
	};
	const struct rmoe_opt attention[] = {
		{"attention", RMOE_OPT_FLAG, &r->attention, 0, 0, NULL, "plan attention recomputation (§3.4)", NULL},
		{"layers", RMOE_OPT_INT, &r->layers, 1, 1024, "L", "layers on a device (preset's)", NULL},
		{"heads", RMOE_OPT_INT, &r->heads, 1, 1e5, "NH", "attention heads (preset's, else 32)", NULL},
		{"kv-heads", RMOE_OPT_INT, &r->kv_heads, 1, 1e5, "NKV", "key/value heads (preset's, else 4)", NULL},
		{"head-dim", RMOE_OPT_INT, &r->head_dim, 1, 1e5, "D", "head dimension (preset's, else 128)", NULL},
		{"model-state", RMOE_OPT_SIZE, &r->model_state, 1, 9e18, "BYTES", "parameters, gradients and optimizer per device", NULL},
	};
	const struct rmoe_opt output[] = {
		{"json", RMOE_OPT_FLAG, &r->json, 0, 0, NULL, "print the plan as JSON", NULL},
	};
	const struct rmoe_opt_set sets[] = {
		RMOE_OPT_SET("the layer's shape", shape, RMOE_PRESET_NOTE),
		RMOE_OPT_SET("the layer", layer, NULL),
		RMOE_OPT_SET("parallelism and the cluster", parallel, NULL),
		RMOE_OPT_SET("attention", attention, NULL),
		RMOE_OPT_SET("output", output, NULL),
	};
	return rmoe_app_options(sets, RMOE_NELEMS(sets), argc, argv, first, usage_head, usage_tail, msg, len);
}

/* The layer and its routing problem from the options; 0 or RMOE_EINVAL with
 * msg. */
static int make_problem(const struct plan_opts *r, int nranks, struct rmoe_layer_config *cfg,
                        struct rmoe_routing_problem *p, char *msg, size_t len)
{
	int rc = rmoe_app_shape_config(&r->preset, &r->shape, cfg, msg, len);
	if (!rc)
		rc = rmoe_app_ring_config(&r->ring, cfg, msg, len);
	if (rc)
		return rc;
	if (r->shared_gated && cfg->shared_ffn == 0) {
		snprintf(msg, len, "--shared-gated needs a shared expert: expected --shared-ffn FS with FS > 0");
		return RMOE_EINVAL;
	}
	if (r->shared_gated)
		cfg->shared_gated = 1;
	if (r->shape.g_tokens && r->g_seq) {
		snprintf(msg, len, "--tokens and --seq both given: expected one way to say tokens per rank");
		return RMOE_EINVAL;
	}
	if ((r->g_mb || r->g_sp || r->g_cp) && !r->g_seq) {
		snprintf(msg, len, "--micro-batch, --sp and --cp need --seq (tokens per rank = B*S/(SP*CP))");
		return RMOE_EINVAL;
	}
	if (r->g_seq) {
		int64_t bs, spcp;
		if (__builtin_mul_overflow(r->micro_batch, r->seq, &bs) || __builtin_mul_overflow(r->sp, r->cp, &spcp)) {
			snprintf(msg, len, "--micro-batch x --seq or --sp x --cp overflows");
			return RMOE_EINVAL;
		}
		if (bs % spcp) {
			snprintf(msg, len,
			         "B*S = %lld x %lld is not divisible by SP*CP = %lld x %lld: expected whole tokens per rank",
			         (long long)r->micro_batch, (long long)r->seq, (long long)r->sp, (long long)r->cp);
			return RMOE_EINVAL;
		}
		cfg->tokens = bs / spcp;
	}
	/* What the plan is made for: auto dispatch (the routing choice), the
	 * cap's chunking when asked. */
	cfg->dispatch = RMOE_DISPATCH_AUTO;
	*p = rmoe_routing_problem_of(cfg, nranks, r->etp);
	rc = rmoe_routing_check(p);
	if (rc)
		snprintf(msg, len, "%s", rmoe_strerror(rc));
	return rc;
}

/* ---- output, built whole before anything is printed ------------------------ */

struct text {
	char *s;
	size_t len, cap;
	int failed;
};

static void put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct text *t, const char *fmt, ...)
{
	if (t->failed)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0) {
		t->failed = 1;
		return;
	}
	if (t->len + (size_t)n + 1 > t->cap) {
		size_t cap = t->cap ? t->cap : 4096;
		while (cap < t->len + (size_t)n + 1)
			cap *= 2;
		char *s = realloc(t->s, cap);
		if (!s) {
			t->failed = 1;
			return;
		}
		t->s = s;
		t->cap = cap;
	}
	va_start(ap, fmt);
	vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
	va_end(ap);
	t->len += (size_t)n;
}

/* A JSON string literal (RFC 8259 escapes). */
static void put_json_string(struct text *t, const char *s)
{
	put(t, "\"");
	for (const unsigned char *c = (const unsigned char *)(s ? s : ""); *c; c++) {
		if (*c == '"' || *c == '\\')
			put(t, "\\%c", *c);
		else if (*c < 0x20)
			put(t, "\\u%04x", *c);
		else
			put(t, "%c", *c);
	}
	put(t, "\"");
}

static const char *mode_name(enum rmoe_dispatch d)
{
	return rmoe_dispatcher_of(d)->mode;
}

struct plan_view {
	const struct plan_opts *opts;
	const struct rmoe_routing_problem *p;
	const struct rmoe_topology *t;
	const struct rmoe_plan *plan;
	int live;
	const struct rmoe_layer_config *cfg; /* the layer: its routing */
};

/* What the memory cap's chunking costs: chunks per hop and the tasks they
 * add, priced at about 40 us per StarPU task on a GPU
 * (../shared/notes/starpu-cuda.md), three tasks per backward chunk. */
#define TASK_SECONDS 40e-6

struct cap_cost {
	double chunks_per_hop, extra_tasks;
};

static struct cap_cost cap_cost(const struct plan_view *v)
{
	struct cap_cost c = {0, 0};
	const struct rmoe_plan *plan = v->plan;
	if (plan->cap_rc || plan->chunk_rows <= 0)
		return c;
	c.chunks_per_hop = ceil(plan->routing.pairs_per_hop / (double)plan->chunk_rows);
	c.extra_tasks = (c.chunks_per_hop - 1) * 3 * (double)v->p->ep;
	return c;
}

static const struct rmoe_hop_cost *chosen(const struct rmoe_plan *plan)
{
	return plan->routing.tokens_travel ? plan->routing.token : plan->routing.expert;
}

/* Selective attention recomputation (§3.4), once per dispatcher: the memory
 * each MoE block needs decides how much attention the device can keep. SP
 * shards the sequence over the tensor-parallel ranks, so TP = SP here. */
struct plan_attention {
	struct rmoe_attn_plan_input in, per[2];
	struct rmoe_attn_plan plan[2];   /* ring expert routing, all-to-all */
	int rc[2];
	int64_t model_state;
	int estimated_state;
};

static void plan_attention(const struct plan_view *v, struct plan_attention *a)
{
	memset(a, 0, sizeof(*a));
	const struct plan_opts *r = v->opts;
	const struct rmoe_routing_problem *p = v->p;
	const struct rmoe_preset *ps = r->preset.preset ? rmoe_preset_find(r->preset.preset) : NULL;
	struct rmoe_attn_plan_input *in = &a->in;
	in->layers = r->layers ? r->layers : (ps ? ps->layers : 1);
	in->heads = r->heads ? r->heads : (ps ? ps->heads : 32);
	in->kv_heads = r->kv_heads ? r->kv_heads : (ps ? ps->kv_heads : 4);
	in->head_dim = r->head_dim ? r->head_dim : (ps ? ps->head_dim : 128);
	in->hidden = p->hidden;
	in->seq_len = r->g_seq ? r->seq : p->tokens * r->sp * r->cp / r->micro_batch;
	in->micro_batch = r->micro_batch;
	in->tp = r->sp;
	in->sp = r->sp > 1;
	in->cp = r->cp;
	in->ep = p->ep;
	in->dtype_bytes = p->dtype == RMOE_DTYPE_BF16 ? 2 : 4;
	const struct rmoe_plan_memory *mem = &v->plan->memory;
	in->device_bytes = mem->budget;
	in->moe_ffn = p->ffn;
	in->moe_topk = p->topk;
	/* Model state: bf16 parameters and fp32 gradients (6 bytes per parameter)
	 * plus fp32 master copy and two Adam moments (12 bytes) sharded over DP
	 * as a distributed optimizer does. */
	double attn = (double)p->hidden * (double)(in->heads + 2 * in->kv_heads) * (double)in->head_dim +
	              (double)in->heads * (double)in->head_dim * (double)p->hidden;
	double moe = (double)p->hidden * (double)p->experts +
	             (double)(p->experts / p->ep) * 3.0 * (double)p->hidden * (double)(p->ffn / p->etp);
	a->model_state = r->model_state;
	a->estimated_state = !r->model_state;
	if (!a->model_state)
		a->model_state = (int64_t)((6.0 + 12.0 / (double)(r->dp ? r->dp : 1)) * (double)in->layers *
		                           (attn / (double)in->tp + moe));
	in->model_state_bytes = a->model_state;
	const struct rmoe_mem_estimate *est[2] = {&mem->est[0], &mem->est[2]};
	for (int i = 0; i < 2; i++) {
		struct rmoe_attn_plan_input x = *in;
		/* one block's transient peak; every block keeps its saved input and routing */
		x.moe_peak_bytes = est[i]->peak_backward - est[i]->resident_backward;
		int64_t saved = p->tokens * p->hidden * (int64_t)in->dtype_bytes +
		                p->tokens * p->experts * 4 + 4 * p->tokens * p->topk * 4;
		x.other_activation_bytes = in->layers * saved;
		a->per[i] = x;
		a->rc[i] = rmoe_attn_plan(&x, &a->plan[i]);
	}
}

static void print_text(struct text *o, const struct plan_view *v)
{
	const struct rmoe_routing_problem *p = v->p;
	const struct rmoe_topology *t = v->t;
	const struct rmoe_plan *plan = v->plan;
	const struct rmoe_routing_choice *rc = &plan->routing;
	const char *dt = p->dtype == RMOE_DTYPE_BF16 ? "bf16" : "f32";

	put(o, "relaymoe plan: %s%sH=%lld F=%lld E=%lld K=%lld, %lld tokens per rank, EP=%lld ETP=%lld, %s\n",
	    v->opts->preset.preset ? v->opts->preset.preset : "", v->opts->preset.preset ? ", " : "", (long long)p->hidden,
	    (long long)p->ffn, (long long)p->experts, (long long)p->topk, (long long)p->tokens, (long long)p->ep,
	    (long long)p->etp, dt);
	if (v->opts->preset.preset && v->opts->preset.scale != 1.0)
		put(o, "  (H, F and tokens of %s divided by %g)\n", v->opts->preset.preset, v->opts->preset.scale);
	char routing[160];
	rmoe_app_routing_line(v->cfg, routing, sizeof(routing));
	put(o, "routing: %s\n", routing);
	if (v->opts->cluster)
		put(o, "cluster: %s (%s)\n", t->cluster, v->opts->cluster);
	else
		put(o, "cluster: none given; links and device rates are the built-in H100-class assumptions\n");
	put(o, "placement: %s; %d rank(s) on %d node(s)\n", t->placement, t->nranks, t->nnodes);
	if (v->live)
		put(o, "this machine (hwloc): %d cores, %d NUMA node(s), %d GPU(s), NVLink %s\n", t->local.cores,
		    t->local.numa_nodes, t->local.gpus,
		    t->local.nvlink > 0 ? "yes" : t->local.nvlink == 0 ? "no" : "unknown");
	put(o, "device: %g TFLOP/s %s for planning, %.1f GiB\n",
	    p->dtype == RMOE_DTYPE_BF16 ? t->bf16_tflops : t->f32_tflops, dt,
	    (double)t->memory_bytes / (1024.0 * 1024 * 1024));
	if (!t->gpu_link_known)
		put(o, "GPU-GPU link: NVLink could not be detected; PCIe assumed\n");

	int shared = 0;
	put(o, "\nring order (%s%d node crossing(s)", v->opts->ring.ring_order[0] == 'r' ? "rank order, as asked; " : "",
	    plan->node_crossings);
	if (t->nnodes > 1)
		put(o, "; a ring over %d nodes needs at least %d", t->nnodes, t->nnodes);
	put(o, "):\n  %4s %6s %5s %7s    %6s  %-12s %9s %11s\n", "pos", "rank", "node", "device", "next",
	    "link", "GB/s", "latency us");
	for (int i = 0; i < plan->nranks; i++) {
		const struct rmoe_ring_edge *e = &plan->edges[i];
		char dev[16];
		if (t->device[e->from] >= 0)
			snprintf(dev, sizeof(dev), "%d", t->device[e->from]);
		else
			snprintf(dev, sizeof(dev), "host");
		put(o, "  %4d %6d %5d %7s -> %6d  %-12s %9.3g %11.1f\n", i, e->from, t->node[e->from], dev, e->to,
		    rmoe_link_name(e->link), e->bandwidth_gbs, e->latency_us);
		shared = e->sharing > shared ? e->sharing : shared;
	}
	if (t->nics_per_node > 0)
		put(o, "  (nics_per_node = %d: the ring edges leaving or entering a node share its network adapters; "
		       "here up to %d edge(s) share one, and GB/s is an edge's share)\n",
		    t->nics_per_node, shared);

	put(o, "\nper hop: %.0f expected token-expert pairs (uniform routing), %lld hop(s) with a transfer;\n"
	       "transfer over the slowest edge, compute at the device rate:\n",
	    rc->pairs_per_hop, (long long)(p->ep - 1));
	put(o, "  %-7s %-9s %12s %12s %12s %11s %11s %7s\n", "mode", "pass", "Table 2 MB", "carried MB",
	    "transfer ms", "compute ms", "exposed ms", "hidden");
	for (int m = 0; m < 2; m++)
		for (int b = 0; b < 2; b++) {
			const struct rmoe_hop_cost *c = m ? &rc->token[b] : &rc->expert[b];
			double table2 = m ? rc->token_table2[b] : c->bytes;
			put(o, "  %-7s %-9s %12.1f %12.1f %12.3f %11.3f %11.3f %6.0f%%\n", m ? "token" : "expert",
			    b ? "backward" : "forward", table2 / 1e6, c->bytes / 1e6, c->transfer_s * 1e3,
			    c->compute_s * 1e3, c->exposed_s * 1e3, 100.0 * c->hidden_fraction);
		}
	put(o, "  (Table 2: E/EP x W per hop for experts, T x (H + M) for tokens, M = K x 8 bytes of\n"
	       "  routing; the token ring here also carries the output accumulator, and dx, dg backward)\n");
	put(o, "ring pass, expert routing: forward %.3f ms, backward %.3f ms (compute + (N-1) x max(transfer, "
	       "compute), backward + the gradients' return)\n",
	    1e3 * rmoe_ring_pass_seconds(&rc->expert[0], p->ep, 0),
	    1e3 * rmoe_ring_pass_seconds(&rc->expert[1], p->ep, 1));

	const struct rmoe_hop_cost *c = chosen(plan);
	put(o, "\nchoice: %s routing\n  %s\n", mode_name(rc->mode), rc->reason);
	put(o, "crossover: token routing below %lld tokens per rank, expert routing from there\n",
	    (long long)rc->crossover_tokens);
	put(o, "expected overlap (%s routing): %.0f%% of each forward hop's transfer and %.0f%% of each "
	       "backward hop's hidden behind compute\n",
	    mode_name(rc->mode), 100.0 * c[0].hidden_fraction, 100.0 * c[1].hidden_fraction);
	const struct rmoe_plan_memory *mem = &plan->memory;
	const double GiB = 1024.0 * 1024 * 1024;
	put(o, "\nmemory per rank (scheduler/memory_model.c, even routing):\n");
	put(o, "  %-12s %14s %14s %16s\n", "mode", "peak fwd GiB", "peak bwd GiB", "max tokens/rank");
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++)
		put(o, "  %-12s %14.2f %14.2f %16lld\n", rmoe_dispatch_name(rmoe_dispatchers[i].kind),
		    mem->est[i].peak_forward / GiB, mem->est[i].peak_backward / GiB, (long long)mem->max_tokens[i]);
	put(o, "  max tokens: the largest local token count whose peak fits %.2f GiB%s; ring/a2a "
	       "%.2fx, token/a2a %.2fx, ring/a2a-megatron %.2fx, ring/a2a-deepep %.2fx\n",
	    mem->budget / GiB, v->opts->budget > 0 ? "" : " (the device's memory)",
	    mem->max_tokens[2] ? (double)mem->max_tokens[0] / (double)mem->max_tokens[2] : 0.0,
	    mem->max_tokens[2] ? (double)mem->max_tokens[1] / (double)mem->max_tokens[2] : 0.0,
	    mem->max_tokens[3] ? (double)mem->max_tokens[0] / (double)mem->max_tokens[3] : 0.0,
	    mem->max_tokens[4] ? (double)mem->max_tokens[0] / (double)mem->max_tokens[4] : 0.0);
	if (v->opts->ring.mem_cap > 0) {
		struct cap_cost cc = cap_cost(v);
		if (plan->cap_rc)
			put(o, "  memory cap: %s\n", plan->cap_msg);
		else
			put(o, "  memory cap %.2f GiB (%s routing): chunks of %lld rows, %.0f per hop; about %.0f "
			       "more tasks per pass, %.1f ms at %.0f us each\n",
			    (double)v->opts->ring.mem_cap / GiB, mode_name(rc->mode), (long long)plan->chunk_rows,
			    cc.chunks_per_hop, cc.extra_tasks, cc.extra_tasks * TASK_SECONDS * 1e3, TASK_SECONDS * 1e6);
		/* Every dispatcher at the chunking the cap asks of it: a hop's
		 * rows for the rings, a block's (one peer's rows) for an
		 * all-to-all, both E/N experts' worth at even routing. */
		put(o, "  under the cap, worst routing (rows per chunk; chunks per hop or block at even routing):\n");
		for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++) {
			const char *name = rmoe_dispatch_name(rmoe_dispatchers[i].kind);
			if (mem->cap_rc[i] == RMOE_ENOTSUP)
				put(o, "    %-12s takes no cap (it %s)\n", name, rmoe_dispatchers[i].no_cap);
			else if (mem->cap_rc[i])
				put(o, "    %-12s cannot meet it: the cap is below what it holds before a chunk's rows\n", name);
			else
				put(o, "    %-12s %lld rows, %.0f per hop or block\n", name, (long long)mem->cap_chunk_rows[i],
				    ceil(plan->routing.pairs_per_hop / (double)mem->cap_chunk_rows[i]));
		}
	}
	if (!v->opts->attention)
		return;
	struct plan_attention at;
	plan_attention(v, &at);
	put(o, "\nattention recomputation (§3.4): %lld layers, %lld heads (%lld KV) of %lld, sequence %lld, "
	       "micro-batch %lld, TP=SP %lld, CP %lld; model state %.1f GiB%s\n",
	    (long long)at.in.layers, (long long)at.in.heads, (long long)at.in.kv_heads,
	    (long long)at.in.head_dim, (long long)at.in.seq_len, (long long)at.in.micro_batch,
	    (long long)at.in.tp, (long long)at.in.cp, at.model_state / GiB,
	    at.estimated_state ? " (6 + 12/DP bytes per parameter; --model-state to set)" : "");
	const char *labels[2] = {"ring", "a2a"};
	for (int i = 0; i < 2; i++) {
		if (at.rc[i]) {
			put(o, "  %s: %s\n", labels[i], rmoe_strerror(at.rc[i]));
			continue;
		}
		char buf[8192];
		rmoe_attn_plan_format(&at.per[i], &at.plan[i], labels[i], buf, sizeof(buf));
		put(o, "%s", buf);
	}
	if (!at.rc[0] && !at.rc[1])
		put(o, "  attention layers retained: ring %lld, a2a %lld of %lld; predicted step speed-up from "
		       "less recomputation: ring %.3fx, a2a %.3fx\n",
		    (long long)at.plan[0].retained_layers, (long long)at.plan[1].retained_layers,
		    (long long)at.in.layers, at.plan[0].predicted_gain, at.plan[1].predicted_gain);
}

static void put_hop_json(struct text *o, const struct rmoe_hop_cost *c)
{
	put(o, "{\"bytes\": %.0f, \"transfer_ms\": %.6g, \"compute_ms\": %.6g, \"exposed_ms\": %.6g, "
	       "\"hidden_fraction\": %.6g, \"slowest_edge\": %d}",
	    c->bytes, c->transfer_s * 1e3, c->compute_s * 1e3, c->exposed_s * 1e3, c->hidden_fraction,
	    c->slowest_edge);
}

static void print_json(struct text *o, const struct plan_view *v)
{
	const struct rmoe_routing_problem *p = v->p;
	const struct rmoe_topology *t = v->t;
	const struct rmoe_plan *plan = v->plan;
	const struct rmoe_routing_choice *rc = &plan->routing;

	put(o, "{\n  \"model\": {\"preset\": ");
	if (v->opts->preset.preset)
		put_json_string(o, v->opts->preset.preset);
	else
		put(o, "null");
	put(o, ", \"scale\": %.6g, \"hidden\": %lld, \"ffn\": %lld, \"experts\": %lld, \"topk\": %lld, "
	    "\"norm_topk\": %s, \"shared_ffn\": %lld, \"shared_gated\": %s},\n",
	    v->opts->preset.scale, (long long)p->hidden, (long long)p->ffn, (long long)p->experts, (long long)p->topk,
	    v->cfg->norm_topk ? "true" : "false", (long long)v->cfg->shared_ffn, v->cfg->shared_gated ? "true" : "false");
	put(o, "  \"tokens_per_rank\": %lld,\n  \"ranks\": %lld,\n  \"etp\": %lld,\n  \"dtype\": \"%s\",\n",
	    (long long)p->tokens, (long long)p->ep, (long long)p->etp,
	    p->dtype == RMOE_DTYPE_BF16 ? "bf16" : "f32");
	put(o, "  \"cluster\": {\"name\": ");
	put_json_string(o, t->cluster);
	put(o, ", \"file\": ");
	if (v->opts->cluster)
		put_json_string(o, v->opts->cluster);
	else
		put(o, "null");
	put(o, ", \"placement\": ");
	put_json_string(o, t->placement);
	put(o, ", \"live\": %s, \"nodes\": %d, \"device_tflops\": %.6g, \"device_memory_bytes\": %lld, "
	       "\"gpu_link\": \"%s\", \"gpu_link_known\": %s},\n",
	    v->live ? "true" : "false", t->nnodes, rc->device_tflops, (long long)t->memory_bytes,
	    rmoe_link_name(t->gpu_link), t->gpu_link_known ? "true" : "false");
	if (v->live)
		put(o, "  \"machine\": {\"cores\": %d, \"numa_nodes\": %d, \"gpus\": %d, \"nvlink\": %s},\n",
		    t->local.cores, t->local.numa_nodes, t->local.gpus,
		    t->local.nvlink > 0 ? "true" : t->local.nvlink == 0 ? "false" : "null");
	put(o, "  \"ring\": {\"order\": [");
	for (int i = 0; i < plan->nranks; i++)
		put(o, "%s%d", i ? ", " : "", plan->order[i]);
	put(o, "], \"ring_order\": \"%s\", \"nics_per_node\": %d, \"node_crossings\": %d, \"edges\": [\n",
	    v->opts->ring.ring_order[0] == 'r' ? "rank" : "planned", t->nics_per_node, plan->node_crossings);
	for (int i = 0; i < plan->nranks; i++) {
		const struct rmoe_ring_edge *e = &plan->edges[i];
		put(o, "    {\"position\": %d, \"from\": %d, \"to\": %d, \"from_node\": %d, \"to_node\": %d, "
		       "\"from_device\": %d, \"link\": \"%s\", \"bandwidth_gbs\": %.6g, \"latency_us\": %.6g, "
		       "\"sharing\": %d}%s\n",
		    i, e->from, e->to, t->node[e->from], t->node[e->to], t->device[e->from], rmoe_link_name(e->link),
		    e->bandwidth_gbs, e->latency_us, e->sharing, i + 1 < plan->nranks ? "," : "");
	}
	put(o, "  ]},\n  \"hops\": {\"pairs_per_hop\": %.6g, \"transfer_hops\": %lld,\n", rc->pairs_per_hop,
	    (long long)(p->ep - 1));
	for (int m = 0; m < 2; m++) {
		const struct rmoe_hop_cost *c = m ? rc->token : rc->expert;
		put(o, "    \"%s\": {\"forward\": ", m ? "token" : "expert");
		put_hop_json(o, &c[0]);
		put(o, ",\n              \"backward\": ");
		put_hop_json(o, &c[1]);
		put(o, "}%s\n", m ? "" : ",");
	}
	put(o, "  },\n  \"pass_ms\": {\"expert\": {\"forward\": %.6g, \"backward\": %.6g}},\n",
	    1e3 * rmoe_ring_pass_seconds(&rc->expert[0], p->ep, 0),
	    1e3 * rmoe_ring_pass_seconds(&rc->expert[1], p->ep, 1));
	const struct rmoe_hop_cost *c = chosen(plan);
	put(o, "  \"choice\": {\"mode\": \"%s\", \"crossover_tokens\": %lld, \"reason\": ", mode_name(rc->mode),
	    (long long)rc->crossover_tokens);
	put_json_string(o, rc->reason);
	put(o, "},\n  \"overlap\": {\"forward_hidden_fraction\": %.6g, \"backward_hidden_fraction\": %.6g},\n",
	    c[0].hidden_fraction, c[1].hidden_fraction);
	const struct rmoe_plan_memory *mem = &plan->memory;
	put(o, "  \"memory\": {\"modelled\": true, \"budget_bytes\": %lld, \"dispatchers\": {",
	    (long long)mem->budget);
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++)
		put(o, "%s\"%s\": {\"peak_forward_bytes\": %lld, \"peak_backward_bytes\": %lld, "
		       "\"resident_forward_bytes\": %lld, \"resident_backward_bytes\": %lld, "
		       "\"weights_and_inputs_bytes\": %lld, \"largest_buffer_bytes\": %lld, "
		       "\"largest_trainable_tokens\": %lld}",
		    i ? ", " : "", rmoe_dispatch_name(rmoe_dispatchers[i].kind), (long long)mem->est[i].peak_forward,
		    (long long)mem->est[i].peak_backward, (long long)mem->est[i].resident_forward,
		    (long long)mem->est[i].resident_backward, (long long)mem->est[i].weights_and_inputs,
		    (long long)mem->est[i].largest_buffer, (long long)mem->max_tokens[i]);
	put(o, "}");
	if (v->opts->ring.mem_cap > 0) {
		put(o, ", \"mem_cap\": {\"bytes\": %lld, \"chunk_rows\": %lld, \"error\": ",
		    (long long)v->opts->ring.mem_cap, plan->cap_rc ? 0LL : (long long)plan->chunk_rows);
		if (plan->cap_rc)
			put_json_string(o, plan->cap_msg);
		else
			put(o, "null");
		put(o, ", \"dispatchers\": {");
		for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++) {
			put(o, "%s\"%s\": ", i ? ", " : "", rmoe_dispatch_name(rmoe_dispatchers[i].kind));
			if (mem->cap_rc[i])
				put(o, "{\"chunk_rows\": 0, \"error\": \"%s\"}",
				    mem->cap_rc[i] == RMOE_ENOTSUP ? "takes no cap" : "cap too small");
			else
				put(o, "{\"chunk_rows\": %lld, \"error\": null}", (long long)mem->cap_chunk_rows[i]);
		}
		put(o, "}}");
	}
	put(o, "}");
	if (v->opts->attention) {
		struct plan_attention at;
		plan_attention(v, &at);
		put(o, ",\n  \"attention\": {\"model_state_bytes\": %lld", (long long)at.model_state);
		const char *labels[2] = {"ring", "a2a"};
		for (int i = 0; i < 2; i++) {
			char buf[16384];
			if (at.rc[i] || rmoe_attn_plan_json(&at.per[i], &at.plan[i], labels[i], buf, sizeof(buf)) <= 0)
				put(o, ", \"%s\": null", labels[i]);
			else
				put(o, ", \"%s\": %s", labels[i], buf);
		}
		put(o, "}");
	}
	put(o, "\n}\n");
}

/* The live topology: every rank's host name and GPUs, gathered. */
static int live_topology(const struct rmoe_cluster *cluster, struct rmoe_topology *topo)
{
	int size = 1, len = 0;
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	char name[MPI_MAX_PROCESSOR_NAME + 1] = "";
	if (MPI_Get_processor_name(name, &len) != MPI_SUCCESS || len <= 0)
		snprintf(name, sizeof(name), "unnamed");
	name[MPI_MAX_PROCESSOR_NAME] = '\0';
	struct rmoe_rank_info me, *all = calloc((size_t)size, sizeof(*all));
	struct rmoe_local_hw hw;
	rmoe_rank_info_local(name, &me, &hw);
	int rc = rmoe_app_agree(all ? 0 : RMOE_ENOMEM);
	if (!rc && MPI_Allgather(&me, (int)sizeof(me), MPI_BYTE, all, (int)sizeof(me), MPI_BYTE, MPI_COMM_WORLD) !=
	                   MPI_SUCCESS)
		rc = rmoe_error(RMOE_EMPI, "MPI_Allgather of host names failed");
	for (int q = 0; !rc && q < size; q++)
		all[q].host[RMOE_HOST_MAX - 1] = '\0';
	if (!rc)
		rc = rmoe_topology_from_ranks(all, size, cluster, topo);
	if (!rc)
		topo->local = hw;
	free(all);
	return rc;
}

/* Rank 0 reports; every rank has reached the same verdict. */
static void say_error(const char *msg)
{
	int rank = 0;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (rank == 0) {
		fprintf(stderr, "relaymoe plan: %s\n", msg);
		fflush(stderr);
	}
}

int rmoe_cmd_plan(int argc, char **argv, int first)
{
	struct plan_opts r = {.preset.scale = 1.0, .ring = {.dtype = "bf16", .ring_order = "planned"}, .micro_batch = 1,
	                      .sp = 1, .cp = 1, .etp = 1, .dp = 1};
	char msg[1024];
	int prc = parse_options(&r, argc, argv, first, msg, sizeof(msg));
	if (prc == 1)
		return 0;
	int size = 1;
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	int nranks = r.g_ranks ? (int)r.ranks : size;
	struct rmoe_routing_problem prob;
	struct rmoe_layer_config cfg;
	if (!prc)
		prc = make_problem(&r, nranks, &cfg, &prob, msg, sizeof(msg));
	if (prc) {
		say_error(msg);
		return 2;
	}

	/* A cluster description that one rank cannot read fails on all. */
	struct rmoe_cluster cluster;
	memset(&cluster, 0, sizeof(cluster));
	int rc = r.cluster ? rmoe_cluster_load(r.cluster, &cluster) : 0;
	if (rmoe_app_agree(rc)) {
		say_error(rc ? rmoe_strerror(rc) : "another rank could not read the cluster description");
		rmoe_cluster_free(&cluster);
		return 2;
	}

	struct rmoe_topology topo;
	int live = nranks == size;
	if (live) {
		rc = live_topology(r.cluster ? &cluster : NULL, &topo);
	} else {
		struct rmoe_local_hw hw;
		int have_hw = !r.cluster && rmoe_local_hw_probe(&hw) == 0;
		rc = rmoe_topology_simulated(r.cluster ? &cluster : NULL, have_hw ? &hw : NULL, nranks, &topo);
	}
	struct rmoe_plan plan;
	memset(&plan, 0, sizeof(plan));
	struct rmoe_plan_request req = {.layer = &cfg, .etp = r.etp, .budget = r.budget,
	                                .rank_order = !strcmp(r.ring.ring_order, "rank")};
	if (!rc)
		rc = rmoe_plan_make(&req, &topo, &plan);
	int code = 0;
	if (rmoe_app_agree(rc)) {
		say_error(rc ? rmoe_strerror(rc) : "another rank failed to plan");
		code = rc == RMOE_EINVAL || rc == RMOE_EFORMAT ? 2 : 1;
	} else {
		struct text out = {0};
		struct plan_view v = {&r, &prob, &topo, &plan, live, &cfg};
		if (r.json)
			print_json(&out, &v);
		else
			print_text(&out, &v);
		int rank = 0;
		MPI_Comm_rank(MPI_COMM_WORLD, &rank);
		if (out.failed) {
			say_error("out of host memory formatting the plan");
			code = 1;
		} else if (rank == 0) {
			fwrite(out.s, 1, out.len, stdout);
			fflush(stdout);
		}
		free(out.s);
	}
	rmoe_plan_free(&plan);
	rmoe_topology_free(&topo);
	rmoe_cluster_free(&cluster);
	return code;
}
