/* relaymoe plan's text and JSON (plan_print.h): the same plan, section by
 * section, in both. */
#include <math.h>
#include <stdio.h>

#include "json.h"
#include "options.h"
#include "plan_print.h"
#include "rmoe_dispatchers.h"
#include "rmoe_memory_model.h"

static const double GiB = 1024.0 * 1024 * 1024;

/* What the memory cap's chunking costs: chunks per hop and the tasks they
 * add, priced at about 40 us per StarPU task on a GPU
 * (../shared/notes/starpu-cuda.md), three tasks per backward chunk. */
#define TASK_SECONDS 40e-6

struct cap_cost {
	double chunks_per_hop, extra_tasks;
};

static struct cap_cost cap_cost(const struct rmoe_plan_view *v)
{
	struct cap_cost c = {0, 0};
	const struct rmoe_plan *plan = v->plan;
	if (plan->cap_rc || plan->chunk_rows <= 0)
		return c;
	c.chunks_per_hop = ceil(plan->routing.pairs_per_hop / (double)plan->chunk_rows);
	c.extra_tasks = (c.chunks_per_hop - 1) * 3 * (double)v->p->ep;
	return c;
}

static const char *mode_name(enum rmoe_dispatch d)
{
	return rmoe_dispatcher_of(d)->mode;
}

static const char *dtype_name(const struct rmoe_routing_problem *p)
{
	return p->dtype == RMOE_DTYPE_BF16 ? "bf16" : "f32";
}

/* The chosen mode's hop costs, forward and backward. */
static const struct rmoe_hop_cost *chosen(const struct rmoe_plan *plan)
{
	return plan->routing.tokens_travel ? plan->routing.token : plan->routing.expert;
}

/* ---- text ------------------------------------------------------------------- */

/* The layer, the cluster and the device planned for. */
static void text_setting(struct rmoe_text *o, const struct rmoe_plan_view *v)
{
	const struct rmoe_routing_problem *p = v->p;
	const struct rmoe_topology *t = v->t;
	rmoe_text_put(o, "relaymoe plan: %s%sH=%lld F=%lld E=%lld K=%lld, %lld tokens per rank, EP=%lld ETP=%lld, %s\n",
	              v->preset ? v->preset : "", v->preset ? ", " : "", (long long)p->hidden, (long long)p->ffn,
	              (long long)p->experts, (long long)p->topk, (long long)p->tokens, (long long)p->ep,
	              (long long)p->etp, dtype_name(p));
	if (v->preset && v->scale != 1.0)
		rmoe_text_put(o, "  (H, F and tokens of %s divided by %g)\n", v->preset, v->scale);
	char routing[160];
	rmoe_app_routing_line(v->cfg, routing, sizeof(routing));
	rmoe_text_put(o, "routing: %s\n", routing);
	if (v->cluster_file)
		rmoe_text_put(o, "cluster: %s (%s)\n", t->cluster, v->cluster_file);
	else
		rmoe_text_put(o, "cluster: none given; links and device rates are the built-in H100-class assumptions\n");
	rmoe_text_put(o, "placement: %s; %d rank(s) on %d node(s)\n", t->placement, t->nranks, t->nnodes);
	if (v->live)
		rmoe_text_put(o, "this machine (hwloc): %d cores, %d NUMA node(s), %d GPU(s), NVLink %s\n", t->local.cores,
		              t->local.numa_nodes, t->local.gpus,
		              t->local.nvlink > 0 ? "yes" : t->local.nvlink == 0 ? "no" : "unknown");
	rmoe_text_put(o, "device: %g TFLOP/s %s for planning, %.1f GiB\n",
	              p->dtype == RMOE_DTYPE_BF16 ? t->bf16_tflops : t->f32_tflops, dtype_name(p),
	              (double)t->memory_bytes / GiB);
	if (!t->gpu_link_known)
		rmoe_text_put(o, "GPU-GPU link: NVLink could not be detected; PCIe assumed\n");
}

/* The ring: each position's rank, node, device and the edge to the next. */
static void text_ring(struct rmoe_text *o, const struct rmoe_plan_view *v)
{
	const struct rmoe_topology *t = v->t;
	const struct rmoe_plan *plan = v->plan;
	int shared = 0;
	rmoe_text_put(o, "\nring order (%s%d node crossing(s)", v->rank_order ? "rank order, as asked; " : "",
	              plan->node_crossings);
	if (t->nnodes > 1)
		rmoe_text_put(o, "; a ring over %d nodes needs at least %d", t->nnodes, t->nnodes);
	rmoe_text_put(o, "):\n  %4s %6s %5s %7s    %6s  %-12s %9s %11s\n", "pos", "rank", "node", "device", "next",
	              "link", "GB/s", "latency us");
	for (int i = 0; i < plan->nranks; i++) {
		const struct rmoe_ring_edge *e = &plan->edges[i];
		char dev[16];
		if (t->device[e->from] >= 0)
			snprintf(dev, sizeof(dev), "%d", t->device[e->from]);
		else
			snprintf(dev, sizeof(dev), "host");
		rmoe_text_put(o, "  %4d %6d %5d %7s -> %6d  %-12s %9.3g %11.1f\n", i, e->from, t->node[e->from], dev,
		              e->to, rmoe_link_name(e->link), e->bandwidth_gbs, e->latency_us);
		shared = e->sharing > shared ? e->sharing : shared;
	}
	if (t->nics_per_node > 0)
		rmoe_text_put(o, "  (nics_per_node = %d: the ring edges leaving or entering a node share its network "
		                 "adapters; here up to %d edge(s) share one, and GB/s is an edge's share)\n",
		              t->nics_per_node, shared);
}

/* Per hop, both modes and passes (Table 2); the ring's pass; the choice. */
static void text_hops(struct rmoe_text *o, const struct rmoe_plan_view *v)
{
	const struct rmoe_routing_problem *p = v->p;
	const struct rmoe_routing_choice *rc = &v->plan->routing;
	rmoe_text_put(o, "\nper hop: %.0f expected token-expert pairs (uniform routing), %lld hop(s) with a transfer;\n"
	                 "transfer over the slowest edge, compute at the device rate:\n",
	              rc->pairs_per_hop, (long long)(p->ep - 1));
	rmoe_text_put(o, "  %-7s %-9s %12s %12s %12s %11s %11s %7s\n", "mode", "pass", "Table 2 MB", "carried MB",
	              "transfer ms", "compute ms", "exposed ms", "hidden");
	for (int m = 0; m < 2; m++)
		for (int b = 0; b < 2; b++) {
			const struct rmoe_hop_cost *c = m ? &rc->token[b] : &rc->expert[b];
			double table2 = m ? rc->token_table2[b] : c->bytes;
			rmoe_text_put(o, "  %-7s %-9s %12.1f %12.1f %12.3f %11.3f %11.3f %6.0f%%\n", m ? "token" : "expert",
			              b ? "backward" : "forward", table2 / 1e6, c->bytes / 1e6, c->transfer_s * 1e3,
			              c->compute_s * 1e3, c->exposed_s * 1e3, 100.0 * c->hidden_fraction);
		}
	rmoe_text_put(o, "  (Table 2: E/EP x W per hop for experts, T x (H + M) for tokens, M = K x 8 bytes of\n"
	                 "  routing; the token ring here also carries the output accumulator, and dx, dg backward)\n");
	rmoe_text_put(o, "ring pass, expert routing: forward %.3f ms, backward %.3f ms (compute + (N-1) x max(transfer, "
	                 "compute), backward + the gradients' return)\n",
	              1e3 * rmoe_ring_pass_seconds(&rc->expert[0], p->ep, 0),
	              1e3 * rmoe_ring_pass_seconds(&rc->expert[1], p->ep, 1));
	const struct rmoe_hop_cost *c = chosen(v->plan);
	rmoe_text_put(o, "\nchoice: %s routing\n  %s\n", mode_name(rc->mode), rc->reason);
	rmoe_text_put(o, "crossover: token routing below %lld tokens per rank, expert routing from there\n",
	              (long long)rc->crossover_tokens);
	rmoe_text_put(o, "expected overlap (%s routing): %.0f%% of each forward hop's transfer and %.0f%% of each "
	                 "backward hop's hidden behind compute\n",
	              mode_name(rc->mode), 100.0 * c[0].hidden_fraction, 100.0 * c[1].hidden_fraction);
}

/* The memory cap: the chosen mode's chunks and what they cost, then every
 * dispatcher at the chunking the cap asks of it: a hop's rows for the
 * rings, a block's (one peer's rows) for an all-to-all, both E/N experts'
 * worth at even routing. */
static void text_cap(struct rmoe_text *o, const struct rmoe_plan_view *v)
{
	const struct rmoe_plan *plan = v->plan;
	const struct rmoe_plan_memory *mem = &plan->memory;
	struct cap_cost cc = cap_cost(v);
	if (plan->cap_rc)
		rmoe_text_put(o, "  memory cap: %s\n", plan->cap_msg);
	else
		rmoe_text_put(o, "  memory cap %.2f GiB (%s routing): chunks of %lld rows, %.0f per hop; about %.0f "
		                 "more tasks per pass, %.1f ms at %.0f us each\n",
		              (double)v->mem_cap / GiB, mode_name(plan->routing.mode), (long long)plan->chunk_rows,
		              cc.chunks_per_hop, cc.extra_tasks, cc.extra_tasks * TASK_SECONDS * 1e3, TASK_SECONDS * 1e6);
	rmoe_text_put(o, "  under the cap, worst routing (rows per chunk; chunks per hop or block at even routing):\n");
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++) {
		const char *name = rmoe_dispatch_name(rmoe_dispatchers[i].kind);
		if (mem->cap_rc[i] == RMOE_ENOTSUP)
			rmoe_text_put(o, "    %-12s takes no cap (it %s)\n", name, rmoe_dispatchers[i].no_cap);
		else if (mem->cap_rc[i])
			rmoe_text_put(o, "    %-12s cannot meet it: the cap is below what it holds before a chunk's rows\n",
			              name);
		else
			rmoe_text_put(o, "    %-12s %lld rows, %.0f per hop or block\n", name, (long long)mem->cap_chunk_rows[i],
			              ceil(plan->routing.pairs_per_hop / (double)mem->cap_chunk_rows[i]));
	}
}

/* The memory model's peaks per dispatcher, the largest local token counts
 * that fit, and the cap when one is asked. */
static void text_memory(struct rmoe_text *o, const struct rmoe_plan_view *v)
{
	const struct rmoe_plan_memory *mem = &v->plan->memory;
	rmoe_text_put(o, "\nmemory per rank (scheduler/model/memory_model.c, even routing):\n");
	rmoe_text_put(o, "  %-12s %14s %14s %16s\n", "mode", "peak fwd GiB", "peak bwd GiB", "max tokens/rank");
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++)
		rmoe_text_put(o, "  %-12s %14.2f %14.2f %16lld\n", rmoe_dispatch_name(rmoe_dispatchers[i].kind),
		              mem->est[i].peak_forward / GiB, mem->est[i].peak_backward / GiB, (long long)mem->max_tokens[i]);
	rmoe_text_put(o, "  max tokens: the largest local token count whose peak fits %.2f GiB%s; ring/a2a "
	                 "%.2fx, token/a2a %.2fx, ring/a2a-megatron %.2fx, ring/a2a-deepep %.2fx\n",
	              mem->budget / GiB, v->budget > 0 ? "" : " (the device's memory)",
	              mem->max_tokens[2] ? (double)mem->max_tokens[0] / (double)mem->max_tokens[2] : 0.0,
	              mem->max_tokens[2] ? (double)mem->max_tokens[1] / (double)mem->max_tokens[2] : 0.0,
	              mem->max_tokens[3] ? (double)mem->max_tokens[0] / (double)mem->max_tokens[3] : 0.0,
	              mem->max_tokens[4] ? (double)mem->max_tokens[0] / (double)mem->max_tokens[4] : 0.0);
	if (v->mem_cap > 0)
		text_cap(o, v);
}

static const char *verdict(int fits)
{
	return fits < 0 ? "-" : fits ? "yes" : "no";
}

static const char *paced_by(const struct rmoe_time_bound *b)
{
	int l = b->pass[1].link >= 0 ? b->pass[1].link : b->pass[0].link;
	return l >= 0 ? rmoe_link_name((enum rmoe_link_class)l) : "-";
}

static void text_bound_row(struct rmoe_text *o, const char *name, const struct rmoe_time_bound *b)
{
	rmoe_text_put(o, "  %-12s %9.1f %9.1f %9.3f %9.3f %10.3f %9.3f %9.3f  %-9s %6s %4s\n", name,
	              b->pass[0].bytes / 1e6, b->pass[1].bytes / 1e6, b->pass[0].wire_s * 1e3, b->pass[1].wire_s * 1e3,
	              b->compute_s * 1e3, b->bound_s * 1e3, b->serial_s * 1e3, paced_by(b), verdict(b->fits_device),
	              verdict(b->fits_cap));
}

/* Every dispatcher's time bound (scheduler/rmoe_time_bound.h), with whether
 * its peak fits the device and the cap. */
static void text_time(struct rmoe_text *o, const struct rmoe_plan_view *v)
{
	const struct rmoe_plan_time *tb = &v->plan->time;
	rmoe_text_put(o, "\ntime bound per rank (bench/sim/report.py's terms from the configuration, pass by pass, even routing):\n");
	if (tb->rc) {
		rmoe_text_put(o, "  none: %s\n", rmoe_strerror(tb->rc));
		return;
	}
	rmoe_text_put(o, "  %-12s %9s %9s %9s %9s %10s %9s %9s  %-9s %6s %4s\n", "mode", "fwd MB", "bwd MB", "wire fwd",
	              "wire bwd", "compute", "bound", "serial", "over", "device", "cap");
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++)
		text_bound_row(o, rmoe_dispatch_name(rmoe_dispatchers[i].kind), &tb->est[i]);
	if (tb->stripes > 1) {
		char name[32];
		for (int k = 0; k < 2; k++) {
			snprintf(name, sizeof(name), "%s/%d", k ? "token" : "ring", tb->stripes);
			text_bound_row(o, name, &tb->striped[k]);
		}
	}
	rmoe_text_put(o, "  (MB: what the busiest rank sends per pass; times in ms. wire: those bytes over the link\n"
	                 "  they cross (over: the ring's slowest edge, or an all-to-all rank's adapter or pair link),\n"
	                 "  with latency; compute: GEMM flops of both passes at %g TFLOP/s, no per-task floor;\n"
	                 "  bound = the larger of compute and wire in each pass, summed; serial = compute + wire.\n"
	                 "  device, cap: whether the memory model's peak fits the device and --mem-cap)\n",
	              tb->device_tflops);
	if (tb->stripes > 1)
		rmoe_text_put(o, "  ring/%d, token/%d: the rings with each node-crossing hop striped over %d network adapters,\n"
		                 "  relayed over the GPU links at both ends (--stripes); peaks %.2f and %.2f GiB with the relays'\n"
		                 "  pieces\n",
		              tb->stripes, tb->stripes, tb->stripes, (double)tb->striped_peak[0] / (1 << 30),
		              (double)tb->striped_peak[1] / (1 << 30));
	rmoe_text_put(o, "\ndispatch auto: %s\n  %s\n", rmoe_dispatch_name(v->plan->dispatch), v->plan->dispatch_reason);
}

static void text_attention(struct rmoe_text *o, const struct rmoe_plan_attention *at)
{
	rmoe_text_put(o, "\nattention recomputation (§3.4): %lld layers, %lld heads (%lld KV) of %lld, sequence %lld, "
	                 "micro-batch %lld, TP=SP %lld, CP %lld; model state %.1f GiB%s\n",
	              (long long)at->in.layers, (long long)at->in.heads, (long long)at->in.kv_heads,
	              (long long)at->in.head_dim, (long long)at->in.seq_len, (long long)at->in.micro_batch,
	              (long long)at->in.tp, (long long)at->in.cp, at->model_state / GiB,
	              at->estimated_state ? " (6 + 12/DP bytes per parameter; --model-state to set)" : "");
	const char *labels[2] = {"ring", "a2a"};
	for (int i = 0; i < 2; i++) {
		if (at->rc[i]) {
			rmoe_text_put(o, "  %s: %s\n", labels[i], rmoe_strerror(at->rc[i]));
			continue;
		}
		char buf[8192];
		rmoe_attn_plan_format(&at->per[i], &at->plan[i], labels[i], buf, sizeof(buf));
		rmoe_text_put(o, "%s", buf);
	}
	if (!at->rc[0] && !at->rc[1])
		rmoe_text_put(o, "  attention layers retained: ring %lld, a2a %lld of %lld; predicted step speed-up from "
		                 "less recomputation: ring %.3fx, a2a %.3fx\n",
		              (long long)at->plan[0].retained_layers, (long long)at->plan[1].retained_layers,
		              (long long)at->in.layers, at->plan[0].predicted_gain, at->plan[1].predicted_gain);
}

void rmoe_plan_print_text(struct rmoe_text *o, const struct rmoe_plan_view *v)
{
	text_setting(o, v);
	text_ring(o, v);
	text_hops(o, v);
	text_memory(o, v);
	text_time(o, v);
	if (v->attention)
		text_attention(o, v->attention);
}

/* ---- JSON ------------------------------------------------------------------- */

/* The layer, as members of the document. */
static void json_model(struct rmoe_json *j, const struct rmoe_plan_view *v)
{
	const struct rmoe_routing_problem *p = v->p;
	rmoe_json_key(j, "model");
	rmoe_json_begin_object(j);
	rmoe_json_key_string(j, "preset", v->preset);
	rmoe_json_key_real(j, "scale", v->scale);
	rmoe_json_key_int(j, "hidden", p->hidden);
	rmoe_json_key_int(j, "ffn", p->ffn);
	rmoe_json_key_int(j, "experts", p->experts);
	rmoe_json_key_int(j, "topk", p->topk);
	rmoe_json_key_bool(j, "norm_topk", v->cfg->norm_topk);
	rmoe_json_key_int(j, "shared_ffn", v->cfg->shared_ffn);
	rmoe_json_key_bool(j, "shared_gated", v->cfg->shared_gated);
	rmoe_json_end_object(j);
	rmoe_json_key_int(j, "tokens_per_rank", p->tokens);
	rmoe_json_key_int(j, "ranks", p->ep);
	rmoe_json_key_int(j, "etp", p->etp);
	rmoe_json_key_string(j, "dtype", dtype_name(p));
}

/* The cluster planned for, and this machine when the topology is live. */
static void json_cluster(struct rmoe_json *j, const struct rmoe_plan_view *v)
{
	const struct rmoe_topology *t = v->t;
	rmoe_json_key(j, "cluster");
	rmoe_json_begin_object(j);
	rmoe_json_key_string(j, "name", t->cluster);
	rmoe_json_key_string(j, "file", v->cluster_file);
	rmoe_json_key_string(j, "placement", t->placement);
	rmoe_json_key_bool(j, "live", v->live);
	rmoe_json_key_int(j, "nodes", t->nnodes);
	rmoe_json_key_real(j, "device_tflops", v->plan->routing.device_tflops);
	rmoe_json_key_int(j, "device_memory_bytes", t->memory_bytes);
	rmoe_json_key_string(j, "gpu_link", rmoe_link_name(t->gpu_link));
	rmoe_json_key_bool(j, "gpu_link_known", t->gpu_link_known);
	rmoe_json_end_object(j);
	if (!v->live)
		return;
	rmoe_json_key(j, "machine");
	rmoe_json_begin_object(j);
	rmoe_json_key_int(j, "cores", t->local.cores);
	rmoe_json_key_int(j, "numa_nodes", t->local.numa_nodes);
	rmoe_json_key_int(j, "gpus", t->local.gpus);
	rmoe_json_key(j, "nvlink");
	if (t->local.nvlink < 0)
		rmoe_json_null(j);
	else
		rmoe_json_bool(j, t->local.nvlink > 0);
	rmoe_json_end_object(j);
}

/* The ring's order and its edges, one edge a line. */
static void json_ring(struct rmoe_json *j, const struct rmoe_plan_view *v)
{
	const struct rmoe_topology *t = v->t;
	const struct rmoe_plan *plan = v->plan;
	rmoe_json_key(j, "ring");
	rmoe_json_begin_object(j);
	rmoe_json_key(j, "order");
	rmoe_json_begin_array(j);
	for (int i = 0; i < plan->nranks; i++)
		rmoe_json_int(j, plan->order[i]);
	rmoe_json_end_array(j);
	rmoe_json_key_string(j, "ring_order", v->rank_order ? "rank" : "planned");
	rmoe_json_key_int(j, "nics_per_node", t->nics_per_node);
	rmoe_json_key_int(j, "node_crossings", plan->node_crossings);
	rmoe_json_key(j, "edges");
	rmoe_json_begin_array(j);
	rmoe_json_lines(j, 4, 2);
	for (int i = 0; i < plan->nranks; i++) {
		const struct rmoe_ring_edge *e = &plan->edges[i];
		rmoe_json_begin_object(j);
		rmoe_json_key_int(j, "position", i);
		rmoe_json_key_int(j, "from", e->from);
		rmoe_json_key_int(j, "to", e->to);
		rmoe_json_key_int(j, "from_node", t->node[e->from]);
		rmoe_json_key_int(j, "to_node", t->node[e->to]);
		rmoe_json_key_int(j, "from_device", t->device[e->from]);
		rmoe_json_key_string(j, "link", rmoe_link_name(e->link));
		rmoe_json_key_real(j, "bandwidth_gbs", e->bandwidth_gbs);
		rmoe_json_key_real(j, "latency_us", e->latency_us);
		rmoe_json_key_int(j, "sharing", e->sharing);
		rmoe_json_end_object(j);
	}
	rmoe_json_end_array(j);
	rmoe_json_end_object(j);
}

static void json_hop(struct rmoe_json *j, const char *pass, const struct rmoe_hop_cost *c)
{
	rmoe_json_key(j, pass);
	rmoe_json_begin_object(j);
	rmoe_json_key_whole(j, "bytes", c->bytes);
	rmoe_json_key_real(j, "transfer_ms", c->transfer_s * 1e3);
	rmoe_json_key_real(j, "compute_ms", c->compute_s * 1e3);
	rmoe_json_key_real(j, "exposed_ms", c->exposed_s * 1e3);
	rmoe_json_key_real(j, "hidden_fraction", c->hidden_fraction);
	rmoe_json_key_int(j, "slowest_edge", c->slowest_edge);
	rmoe_json_end_object(j);
}

/* Per hop, each mode on its line, backward under forward; the ring's pass. */
static void json_hops(struct rmoe_json *j, const struct rmoe_plan_view *v)
{
	const struct rmoe_routing_choice *rc = &v->plan->routing;
	rmoe_json_key(j, "hops");
	rmoe_json_begin_object(j);
	rmoe_json_key_real(j, "pairs_per_hop", rc->pairs_per_hop);
	rmoe_json_key_int(j, "transfer_hops", v->p->ep - 1);
	for (int m = 0; m < 2; m++) {
		const struct rmoe_hop_cost *c = m ? rc->token : rc->expert;
		rmoe_json_break(j, 4);
		rmoe_json_key(j, m ? "token" : "expert");
		rmoe_json_begin_object(j);
		json_hop(j, "forward", &c[0]);
		rmoe_json_break(j, 14);
		json_hop(j, "backward", &c[1]);
		rmoe_json_end_object(j);
	}
	rmoe_json_break(j, 2);
	rmoe_json_end_object(j);
	rmoe_json_key(j, "pass_ms");
	rmoe_json_begin_object(j);
	rmoe_json_key(j, "expert");
	rmoe_json_begin_object(j);
	rmoe_json_key_real(j, "forward", 1e3 * rmoe_ring_pass_seconds(&rc->expert[0], v->p->ep, 0));
	rmoe_json_key_real(j, "backward", 1e3 * rmoe_ring_pass_seconds(&rc->expert[1], v->p->ep, 1));
	rmoe_json_end_object(j);
	rmoe_json_end_object(j);
}

/* The mode chosen, why, and how much of its transfers compute hides. */
static void json_choice(struct rmoe_json *j, const struct rmoe_plan_view *v)
{
	const struct rmoe_routing_choice *rc = &v->plan->routing;
	const struct rmoe_hop_cost *c = chosen(v->plan);
	rmoe_json_key(j, "choice");
	rmoe_json_begin_object(j);
	rmoe_json_key_string(j, "mode", mode_name(rc->mode));
	rmoe_json_key_int(j, "crossover_tokens", rc->crossover_tokens);
	rmoe_json_key_string(j, "reason", rc->reason);
	rmoe_json_end_object(j);
	rmoe_json_key(j, "overlap");
	rmoe_json_begin_object(j);
	rmoe_json_key_real(j, "forward_hidden_fraction", c[0].hidden_fraction);
	rmoe_json_key_real(j, "backward_hidden_fraction", c[1].hidden_fraction);
	rmoe_json_end_object(j);
}

/* The memory cap: the chosen mode's chunk rows, then every dispatcher's. */
static void json_cap(struct rmoe_json *j, const struct rmoe_plan_view *v)
{
	const struct rmoe_plan *plan = v->plan;
	const struct rmoe_plan_memory *mem = &plan->memory;
	rmoe_json_key(j, "mem_cap");
	rmoe_json_begin_object(j);
	rmoe_json_key_int(j, "bytes", v->mem_cap);
	rmoe_json_key_int(j, "chunk_rows", plan->cap_rc ? 0LL : (long long)plan->chunk_rows);
	rmoe_json_key_string(j, "error", plan->cap_rc ? plan->cap_msg : NULL);
	rmoe_json_key(j, "dispatchers");
	rmoe_json_begin_object(j);
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++) {
		rmoe_json_key(j, rmoe_dispatch_name(rmoe_dispatchers[i].kind));
		rmoe_json_begin_object(j);
		rmoe_json_key_int(j, "chunk_rows", mem->cap_rc[i] ? 0LL : (long long)mem->cap_chunk_rows[i]);
		rmoe_json_key_string(j, "error", !mem->cap_rc[i]                ? NULL
		                                 : mem->cap_rc[i] == RMOE_ENOTSUP ? "takes no cap"
		                                                                  : "cap too small");
		rmoe_json_end_object(j);
	}
	rmoe_json_end_object(j);
	rmoe_json_end_object(j);
}

/* The memory model's figures per dispatcher, and the cap when one is asked. */
static void json_memory(struct rmoe_json *j, const struct rmoe_plan_view *v)
{
	const struct rmoe_plan_memory *mem = &v->plan->memory;
	rmoe_json_key(j, "memory");
	rmoe_json_begin_object(j);
	rmoe_json_key_bool(j, "modelled", 1);
	rmoe_json_key_int(j, "budget_bytes", mem->budget);
	rmoe_json_key(j, "dispatchers");
	rmoe_json_begin_object(j);
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS; i++) {
		const struct rmoe_mem_estimate *e = &mem->est[i];
		rmoe_json_key(j, rmoe_dispatch_name(rmoe_dispatchers[i].kind));
		rmoe_json_begin_object(j);
		rmoe_json_key_int(j, "peak_forward_bytes", e->peak_forward);
		rmoe_json_key_int(j, "peak_backward_bytes", e->peak_backward);
		rmoe_json_key_int(j, "resident_forward_bytes", e->resident_forward);
		rmoe_json_key_int(j, "resident_backward_bytes", e->resident_backward);
		rmoe_json_key_int(j, "weights_and_inputs_bytes", e->weights_and_inputs);
		rmoe_json_key_int(j, "largest_buffer_bytes", e->largest_buffer);
		rmoe_json_key_int(j, "largest_trainable_tokens", mem->max_tokens[i]);
		rmoe_json_end_object(j);
	}
	rmoe_json_end_object(j);
	if (v->mem_cap > 0)
		json_cap(j, v);
	rmoe_json_end_object(j);
}

static void json_fits(struct rmoe_json *j, const char *key, int fits)
{
	rmoe_json_key(j, key);
	if (fits < 0)
		rmoe_json_null(j);
	else
		rmoe_json_bool(j, fits);
}

static void json_pass_bound(struct rmoe_json *j, const char *pass, const struct rmoe_pass_bound *b)
{
	rmoe_json_key(j, pass);
	rmoe_json_begin_object(j);
	rmoe_json_key_whole(j, "bytes", b->bytes);
	rmoe_json_key_whole(j, "flops", b->flops);
	rmoe_json_key_real(j, "compute_ms", b->compute_s * 1e3);
	rmoe_json_key_real(j, "wire_ms", b->wire_s * 1e3);
	rmoe_json_key_string(j, "link", b->link >= 0 ? rmoe_link_name((enum rmoe_link_class)b->link) : NULL);
	rmoe_json_end_object(j);
}

static void json_bound(struct rmoe_json *j, const char *name, const struct rmoe_time_bound *b)
{
	rmoe_json_key(j, name);
	rmoe_json_begin_object(j);
	json_pass_bound(j, "forward", &b->pass[0]);
	json_pass_bound(j, "backward", &b->pass[1]);
	rmoe_json_key_real(j, "compute_ms", b->compute_s * 1e3);
	rmoe_json_key_real(j, "wire_ms", b->wire_s * 1e3);
	rmoe_json_key_real(j, "bound_ms", b->bound_s * 1e3);
	rmoe_json_key_real(j, "serial_ms", b->serial_s * 1e3);
	json_fits(j, "fits_device", b->fits_device);
	json_fits(j, "fits_mem_cap", b->fits_cap);
	rmoe_json_end_object(j);
}

/* Every dispatcher's time bound, one a line, and its fit. */
static void json_time(struct rmoe_json *j, const struct rmoe_plan_view *v)
{
	const struct rmoe_plan_time *tb = &v->plan->time;
	rmoe_json_key(j, "time_bound");
	rmoe_json_begin_object(j);
	rmoe_json_key_real(j, "device_tflops", tb->device_tflops);
	rmoe_json_key_bool(j, "task_floors", 0);
	rmoe_json_key_string(j, "error", tb->rc ? rmoe_strerror(tb->rc) : NULL);
	rmoe_json_key(j, "dispatchers");
	rmoe_json_begin_object(j);
	rmoe_json_lines(j, 4, 2);
	for (int i = 0; i < RMOE_PLAN_NDISPATCHERS && !tb->rc; i++)
		json_bound(j, rmoe_dispatch_name(rmoe_dispatchers[i].kind), &tb->est[i]);
	rmoe_json_end_object(j);
	/* The striped rings: keyed by routing mode. */
	rmoe_json_key_int(j, "stripes", tb->stripes);
	rmoe_json_key(j, "striped");
	rmoe_json_begin_object(j);
	rmoe_json_lines(j, 4, 2);
	for (int k = 0; k < 2 && !tb->rc && tb->stripes > 1; k++)
		json_bound(j, k ? "token" : "ring", &tb->striped[k]);
	rmoe_json_end_object(j);
	/* What --dispatch auto runs (scheduler/plan.c, plan_auto). */
	const struct rmoe_plan *pl = v->plan;
	rmoe_json_key(j, "auto");
	rmoe_json_begin_object(j);
	rmoe_json_key_string(j, "dispatch", rmoe_dispatch_name(pl->dispatch));
	rmoe_json_key_int(j, "stripes", rmoe_ring_stripes_most(pl->stripe_count, pl->nranks));
	rmoe_json_key_real(j, "bound_ms", pl->auto_bound_s * 1e3);
	rmoe_json_key_string(j, "reason", pl->dispatch_reason);
	rmoe_json_end_object(j);
	rmoe_json_end_object(j);
}

/* Each dispatcher's attention plan, as the planner writes it. */
static void json_attention(struct rmoe_json *j, const struct rmoe_plan_attention *at)
{
	rmoe_json_key(j, "attention");
	rmoe_json_begin_object(j);
	rmoe_json_key_int(j, "model_state_bytes", at->model_state);
	const char *labels[2] = {"ring", "a2a"};
	for (int i = 0; i < 2; i++) {
		char buf[16384];
		rmoe_json_key(j, labels[i]);
		if (at->rc[i] || rmoe_attn_plan_json(&at->per[i], &at->plan[i], labels[i], buf, sizeof(buf)) <= 0)
			rmoe_json_null(j);
		else
			rmoe_json_raw(j, buf);
	}
	rmoe_json_end_object(j);
}

/* One member of the document a line; the nested objects on theirs. */
void rmoe_plan_print_json(struct rmoe_text *o, const struct rmoe_plan_view *v)
{
	struct rmoe_json j;
	rmoe_json_init(&j, o);
	rmoe_json_begin_object(&j);
	rmoe_json_lines(&j, 2, 0);
	json_model(&j, v);
	json_cluster(&j, v);
	json_ring(&j, v);
	json_hops(&j, v);
	json_choice(&j, v);
	json_memory(&j, v);
	json_time(&j, v);
	if (v->attention)
		json_attention(&j, v->attention);
	rmoe_json_end_object(&j);
	rmoe_text_put(o, "\n");
}
