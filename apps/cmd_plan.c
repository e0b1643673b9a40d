/* relaymoe plan: the decisions taken before a layer runs, for a model on a
 * cluster: the ring order and its links, per-hop transfer and compute
 * estimates of expert and token routing (Table 2), the chosen mode and why.
 * Runs as one process (MPI singleton) with --ranks, or under mpirun on the
 * live topology. Nothing is printed until the whole plan is made. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "messages.h"
#include "options.h"
#include "plan_print.h"
#include "rmoe_attn_plan.h"
#include "rmoe_plan.h"
#include "rmoe_system.h"
#include "text.h"

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

/* Selective attention recomputation (§3.4) beside the ring's and a2a's
 * MoE peaks (plan_print.h): the attention's shape from the options, else
 * the preset's, else a common one (32 heads, 4 KV heads of 128). */
static void plan_attention(const struct plan_opts *r, const struct rmoe_routing_problem *p,
                           const struct rmoe_plan *plan, struct rmoe_plan_attention *a)
{
	memset(a, 0, sizeof(*a));
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
	const struct rmoe_plan_memory *mem = &plan->memory;
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

/* The topology planned for: the ranks' own under mpirun (live), else
 * nranks placed on the cluster (or this machine) as the description says. */
static int make_topology(const struct plan_opts *r, const struct rmoe_cluster *cluster, int nranks, int live,
                         struct rmoe_topology *topo)
{
	if (live)
		return live_topology(r->cluster ? cluster : NULL, topo);
	struct rmoe_local_hw hw;
	int have_hw = !r->cluster && rmoe_local_hw_probe(&hw) == 0;
	return rmoe_topology_simulated(r->cluster ? cluster : NULL, have_hw ? &hw : NULL, nranks, topo);
}

/* The plan as text or JSON, built whole, then printed by rank 0; the exit
 * code. */
static int print_plan(const struct plan_opts *r, const struct rmoe_layer_config *cfg,
                      const struct rmoe_routing_problem *prob, const struct rmoe_topology *topo,
                      const struct rmoe_plan *plan, int live)
{
	struct rmoe_plan_attention attention;
	if (r->attention)
		plan_attention(r, prob, plan, &attention);
	const struct rmoe_plan_view v = {
		.preset = r->preset.preset, .scale = r->preset.scale, .cluster_file = r->cluster,
		.rank_order = !strcmp(r->ring.ring_order, "rank"), .mem_cap = r->ring.mem_cap, .budget = r->budget,
		.live = live, .cfg = cfg, .p = prob, .t = topo, .plan = plan, .attention = r->attention ? &attention : NULL,
	};
	struct rmoe_text out = {0};
	if (r->json)
		rmoe_plan_print_json(&out, &v);
	else
		rmoe_plan_print_text(&out, &v);
	int rank = 0, code = 0;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (out.failed) {
		say_error("out of host memory formatting the plan");
		code = 1;
	} else if (rank == 0) {
		fwrite(out.s, 1, out.len, stdout);
		fflush(stdout);
	}
	rmoe_text_free(&out);
	return code;
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
	const int live = nranks == size;
	rc = make_topology(&r, &cluster, nranks, live, &topo);
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
		code = print_plan(&r, &cfg, &prob, &topo, &plan, live);
	}
	rmoe_plan_free(&plan);
	rmoe_topology_free(&topo);
	rmoe_cluster_free(&cluster);
	return code;
}
