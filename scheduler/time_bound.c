/* The time bound per dispatcher (rmoe_time_bound.h says what it is and
 * where its definition comes from): each dispatcher's bytes per pass from
 * what its graph file sends, the layer's flops from codelets/flops.c's
 * formulas, and the wire time over the links the bytes must cross. */
#include <math.h>
#include <stdlib.h>

#include "rmoe_memory_model.h"
#include "rmoe_plan.h"
#include "rmoe_time_bound.h"

/* ---- bytes per pass (even routing) ------------------------------------------------ */

/* Routing values (expert counts, indices, weights and their gradients)
 * travel as 4-byte int32 or float whatever the element type. */
#define ROUTING_BYTES 4.0

/* The expert counts a pass exchanges with every peer before it starts
 * (graph/pass/transfers.c, rmoe_exchange_counts): width int32 each. */
static double counts_bytes(const struct rmoe_routing_problem *p, int64_t width)
{
	return (double)(p->ep - 1) * (double)width * ROUTING_BYTES;
}

/* Rows of a rank's pairs that leave it for a peer: (EP-1)/EP of its T*K. */
static double pairs_leaving(const struct rmoe_routing_problem *p)
{
	return (double)p->tokens * (double)p->topk * (double)(p->ep - 1) / (double)p->ep;
}

/* §3.1, graph/dispatch/ring_expert.c: EP-1 hops each send the partition
 * held (E/EP experts); backward the weights with their gradient
 * accumulators, then the finished gradients go back to their owner. The
 * flow-control credits (a few bytes a hop) are left out. */
void rmoe_traffic_ring_expert(const struct rmoe_routing_problem *p, double bytes[2])
{
	double hops = (double)(p->ep - 1);
	bytes[0] = hops * rmoe_expert_hop_bytes(p, 0);
	bytes[1] = p->ep > 1 ? hops * rmoe_expert_hop_bytes(p, 1) + rmoe_expert_hop_bytes(p, 0) : 0.0;
}

/* §3.2, graph/dispatch/ring_token.c: the counts, EP-1 hops of what the
 * token ring carries, then the finished accumulators back to their owner
 * (forward y, T*H; backward dx and dg, T*(H + K)). */
void rmoe_traffic_ring_token(const struct rmoe_routing_problem *p, double bytes[2])
{
	double hops = (double)(p->ep - 1), s = rmoe_dtype_bytes(p->dtype), T = (double)p->tokens;
	double H = (double)p->hidden, K = (double)p->topk;
	double counts = counts_bytes(p, p->experts);
	bytes[0] = p->ep > 1 ? counts + hops * rmoe_token_hop_bytes_carried(p, 0) + T * H * s : 0.0;
	bytes[1] = p->ep > 1 ? counts + hops * rmoe_token_hop_bytes_carried(p, 1) + T * (H * s + K * ROUTING_BYTES)
	                     : 0.0;
}

/* graph/dispatch/alltoall_fwd.c, alltoall_bwd.c: the counts; forward the x
 * row of each pair leaving and, as the experts' owner, as many output rows
 * back; backward x, dy and the routing weight out, dx and dg back. */
void rmoe_traffic_alltoall(const struct rmoe_routing_problem *p, double bytes[2])
{
	double s = rmoe_dtype_bytes(p->dtype), H = (double)p->hidden, rows = pairs_leaving(p);
	bytes[0] = counts_bytes(p, p->experts) + rows * 2.0 * H * s;
	bytes[1] = rows * (3.0 * H * s + 2.0 * ROUTING_BYTES);
}

/* graph/dispatch/alltoall_megatron.c: a2a's rows, with the probabilities'
 * own all-to-all beside the forward's rows; the backward recomputes the
 * dispatch (x rows and probabilities), sends dy rows, and gets dx rows and
 * the probabilities' gradients back: a2a's bytes. */
void rmoe_traffic_alltoall_megatron(const struct rmoe_routing_problem *p, double bytes[2])
{
	double s = rmoe_dtype_bytes(p->dtype), H = (double)p->hidden, rows = pairs_leaving(p);
	bytes[0] = counts_bytes(p, p->experts) + rows * (2.0 * H * s + ROUTING_BYTES);
	bytes[1] = rows * (3.0 * H * s + 2.0 * ROUTING_BYTES);
}

/* graph/dispatch/alltoall_deepep.c: each token once per rank that owns one
 * of its experts, a uniform router's rmoe_uniform_tokens_per_pair of a
 * block's T*K/EP pairs, with its K codes and K weights; forward the rows
 * out and the combined rows back, backward x and dy out, dx and dg (K per
 * token) back. The counts carry every peer's distinct tokens too (E + EP). */
void rmoe_traffic_alltoall_deepep(const struct rmoe_routing_problem *p, double bytes[2])
{
	double s = rmoe_dtype_bytes(p->dtype), H = (double)p->hidden, K = (double)p->topk;
	double pairs = (double)p->tokens * K / (double)p->ep;
	double tokens = pairs * rmoe_uniform_tokens_per_pair(p->topk, p->experts, p->experts / p->ep);
	double blocks = (double)(p->ep - 1);
	bytes[0] = counts_bytes(p, p->experts + p->ep) + blocks * tokens * (2.0 * H * s + 2.0 * K * ROUTING_BYTES);
	bytes[1] = blocks * tokens * (3.0 * H * s + 3.0 * K * ROUTING_BYTES);
}

/* ---- flops per pass (codelets/flops.c) --------------------------------------------- */

static double gemm(double m, double n, double k)
{
	return 2.0 * m * n * k;
}

/* rmoe_flops_expert_ffn: gate and up, and down unless recomputing. */
static double expert_ffn(double rows, double hidden, double ffn, int with_down)
{
	return (with_down ? 3.0 : 2.0) * gemm(rows, hidden, ffn);
}

/* rmoe_flops_expert_bwd: six GEMMs of the forward's size. */
static double expert_bwd(double rows, double hidden, double ffn)
{
	return 6.0 * gemm(rows, hidden, ffn);
}

double rmoe_layer_pass_flops(const struct rmoe_bound_input *in, int backward)
{
	const struct rmoe_routing_problem *p = in->p;
	double T = (double)p->tokens, H = (double)p->hidden, F = (double)(p->ffn / p->etp);
	double Fs = (double)in->shared_ffn;
	/* Even routing: a rank's experts compute as many pairs as its tokens
	 * route, T*K, whichever dispatcher brings them. */
	double pairs = T * (double)p->topk;
	/* rmoe_flops_router: the logits GEMM; backward dw_router and dx. */
	double router = gemm(T, H, (double)p->experts);
	if (!backward)
		return router + expert_ffn(pairs, H, F, 1) + (Fs > 0 ? expert_ffn(T, H, Fs, 1) : 0.0);
	/* §3.3: the backward recomputes the experts up to the SwiGLU output,
	 * the gated shared expert its whole output (graph/forward_backward.c). */
	double shared = Fs > 0 ? expert_ffn(T, H, Fs, in->shared_gated) + expert_bwd(T, H, Fs) : 0.0;
	return 2.0 * router + expert_ffn(pairs, H, F, 0) + expert_bwd(pairs, H, F) + shared;
}

/* ---- wire per pass ------------------------------------------------------------------- */

static double link_seconds(const struct rmoe_link *l, double bytes, double bandwidth_gbs)
{
	return bandwidth_gbs > 0 ? l->latency_us * 1e-6 + bytes / (bandwidth_gbs * 1e9) : 0.0;
}

/* A ring rank sends everything to its successor: at the pace of the
 * slowest edge for the pass's bytes, one latency per hop. */
static void ring_wire(const struct rmoe_bound_input *in, struct rmoe_pass_bound *pb)
{
	const int n = in->t->nranks;
	if (n < 2 || !(pb->bytes > 0))
		return;
	const struct rmoe_ring_edge *e = &in->edges[rmoe_ring_slowest_edge(in->edges, n, pb->bytes)];
	pb->link = (int)e->link;
	pb->wire_s = e->bandwidth_gbs > 0 ? pb->bytes / (e->bandwidth_gbs * 1e9) + (n - 1) * e->latency_us * 1e-6 : 0.0;
}

/* Rank r's all-to-all wire for peer bytes to each peer (node_ranks: the
 * nnode ranks of its node, r among them): to each node-mate over their
 * pair link, to the other nodes' ranks through its share of its node's
 * adapters (nics_per_node, shared as rmoe_ring_edges shares them among
 * ring edges; without it an adapter per rank); the slower. */
static void rank_wire(const struct rmoe_topology *t, const int *node_ranks, int nnode, int r, double peer,
                      struct rmoe_pass_bound *pb)
{
	for (int i = 0; i < nnode; i++) {
		if (node_ranks[i] == r)
			continue;
		enum rmoe_link_class l = rmoe_topology_link(t, r, node_ranks[i]);
		double s = link_seconds(&t->link[l], peer, t->link[l].bandwidth_gbs);
		if (s > pb->wire_s) {
			pb->wire_s = s;
			pb->link = (int)l;
		}
	}
	int remote = t->nranks - nnode;
	if (remote < 1)
		return;
	const struct rmoe_link *net = &t->link[RMOE_LINK_NETWORK];
	double share = t->nics_per_node > 0 && nnode > t->nics_per_node ? (double)t->nics_per_node / nnode : 1.0;
	double s = link_seconds(net, remote * peer, net->bandwidth_gbs * share);
	if (s > pb->wire_s) {
		pb->wire_s = s;
		pb->link = RMOE_LINK_NETWORK;
	}
}

/* An all-to-all rank spreads its bytes evenly over its EP-1 peers; the
 * busiest rank's wire. Ranks listed by node (a counting sort), so each
 * rank looks at its node-mates only. */
static int alltoall_wire(const struct rmoe_topology *t, struct rmoe_pass_bound *pb)
{
	const int n = t->nranks;
	if (n < 2 || !(pb->bytes > 0))
		return 0;
	int *first = calloc((size_t)t->nnodes + 1, sizeof(int)), *by_node = malloc(sizeof(int) * (size_t)n);
	int *at = malloc(sizeof(int) * ((size_t)t->nnodes + 1));
	int rc = first && by_node && at ? 0 : rmoe_error(RMOE_ENOMEM, "out of host memory for the time bound");
	for (int r = 0; !rc && r < n; r++)
		first[t->node[r] + 1]++;
	for (int v = 0; !rc && v < t->nnodes; v++)
		first[v + 1] += first[v];
	for (int v = 0; !rc && v <= t->nnodes; v++)
		at[v] = first[v];
	for (int r = 0; !rc && r < n; r++)
		by_node[at[t->node[r]]++] = r;
	const double peer = pb->bytes / (n - 1);
	for (int r = 0; !rc && r < n; r++) {
		int v = t->node[r];
		rank_wire(t, by_node + first[v], first[v + 1] - first[v], r, peer, pb);
	}
	free(first);
	free(by_node);
	free(at);
	return rc;
}

/* ---- the bound ----------------------------------------------------------------------- */

static int check_input(const struct rmoe_dispatcher *row, const struct rmoe_bound_input *in)
{
	if (!row || !row->traffic)
		return rmoe_error(RMOE_EINVAL, "time bound of %s: it sends nothing of its own (auto is one of the rings)",
		                  row ? row->name : "(null)");
	if (!in || !in->p || !in->t || !in->edges)
		return rmoe_error(RMOE_EINVAL, "time bound: expected a layer, a topology and its ring's edges");
	int rc = rmoe_routing_check(in->p);
	if (rc)
		return rc;
	if (in->p->ep != in->t->nranks)
		return rmoe_error(RMOE_EINVAL, "time bound: EP = %lld on %d ranks: expected the ranks' count",
		                  (long long)in->p->ep, in->t->nranks);
	if (!(in->tflops > 0) || !isfinite(in->tflops))
		return rmoe_error(RMOE_EINVAL, "time bound: device rate %g TFLOP/s: expected a positive number", in->tflops);
	if (in->shared_ffn < 0)
		return rmoe_error(RMOE_EINVAL, "time bound: shared_ffn = %lld: expected 0 or more",
		                  (long long)in->shared_ffn);
	return 0;
}

int rmoe_time_bound(const struct rmoe_dispatcher *row, const struct rmoe_bound_input *in, struct rmoe_time_bound *out)
{
	if (!out)
		return rmoe_error(RMOE_EINVAL, "rmoe_time_bound: out is NULL");
	*out = (struct rmoe_time_bound){.pass = {{.link = -1}, {.link = -1}}, .fits_device = -1, .fits_cap = -1};
	int rc = check_input(row, in);
	if (rc)
		return rc;
	double bytes[2];
	row->traffic(in->p, bytes);
	for (int b = 0; b < 2 && !rc; b++) {
		struct rmoe_pass_bound *pb = &out->pass[b];
		pb->bytes = bytes[b];
		pb->flops = rmoe_layer_pass_flops(in, b);
		pb->compute_s = pb->flops / (in->tflops * 1e12);
		if (row->family == RMOE_FAMILY_RING)
			ring_wire(in, pb);
		else
			rc = alltoall_wire(in->t, pb);
		out->compute_s += pb->compute_s;
		out->wire_s += pb->wire_s;
		/* A pass ends before the next starts (the layer's passes are
		 * apart in training too): each lasts at least its own compute
		 * and its own wire. */
		out->bound_s += fmax(pb->compute_s, pb->wire_s);
	}
	out->serial_s = out->compute_s + out->wire_s;
	return rc;
}
