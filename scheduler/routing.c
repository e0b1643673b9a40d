/* §3.2 adaptive routing: expert weights or token activations circulate.
 * Table 2 gives the per-hop volumes; the ring's slowest edge turns them into
 * transfer times, which overlap the hop's expert GEMMs (§3.1); what overlap
 * cannot hide decides the mode. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "rmoe_plan.h"

/* Far above any model of Table 1; the crossover's integer products are
 * overflow-checked anyway. */
#define MAX_DIM 1000000LL
#define MAX_TOKENS 1000000000000LL

int rmoe_dtype_bytes(enum rmoe_dtype dtype)
{
	return dtype == RMOE_DTYPE_BF16 ? 2 : 4;
}

int64_t rmoe_routing_metadata_bytes(int64_t topk)
{
	/* Per token: its K expert indices (int32) and K routing weights (fp32). */
	return topk * (int64_t)(sizeof(int32_t) + sizeof(float));
}

struct rmoe_routing_problem rmoe_routing_problem_of(const struct rmoe_layer_config *cfg, int64_t ep, int64_t etp)
{
	return (struct rmoe_routing_problem){.hidden = cfg->hidden, .ffn = cfg->ffn, .experts = cfg->experts,
	                                     .topk = cfg->topk, .tokens = cfg->tokens, .ep = ep,
	                                     .etp = etp > 0 ? etp : 1, .dtype = cfg->dtype};
}

int rmoe_routing_check(const struct rmoe_routing_problem *p)
{
	if (!p)
		return rmoe_error(RMOE_EINVAL, "routing problem is NULL");
	struct {
		const char *name;
		int64_t v, max;
	} dims[] = {{"hidden", p->hidden, MAX_DIM},  {"ffn", p->ffn, MAX_DIM},
	            {"experts", p->experts, MAX_DIM}, {"topk", p->topk, MAX_DIM},
	            {"tokens", p->tokens, MAX_TOKENS}, {"ep", p->ep, RMOE_CLUSTER_MAX_RANKS},
	            {"etp", p->etp, MAX_DIM}};
	for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
		if (dims[i].v < 1 || dims[i].v > dims[i].max)
			return rmoe_error(RMOE_EINVAL, "%s = %lld: expected an integer from 1 to %lld", dims[i].name,
			                  (long long)dims[i].v, (long long)dims[i].max);
	if (p->topk > p->experts)
		return rmoe_error(RMOE_EINVAL, "topk = %lld is larger than experts = %lld: expected K <= E",
		                  (long long)p->topk, (long long)p->experts);
	if (p->experts % p->ep)
		return rmoe_error(RMOE_EINVAL,
		                  "experts = %lld is not divisible by EP = %lld: expected a multiple of the ring's "
		                  "ranks",
		                  (long long)p->experts, (long long)p->ep);
	if (p->ffn % p->etp)
		return rmoe_error(RMOE_EINVAL,
		                  "ffn = %lld is not divisible by ETP = %lld: expert tensor parallelism splits F",
		                  (long long)p->ffn, (long long)p->etp);
	if (p->dtype != RMOE_DTYPE_F32 && p->dtype != RMOE_DTYPE_BF16)
		return rmoe_error(RMOE_EINVAL, "dtype = %d: expected f32 or bf16", (int)p->dtype);
	return 0;
}

/* Table 2 (with SP, CP and ETP): E/EP experts of W/ETP bytes each. */
double rmoe_expert_hop_bytes(const struct rmoe_routing_problem *p, int backward)
{
	double w = 3.0 * (double)p->hidden * (double)(p->ffn / p->etp) * rmoe_dtype_bytes(p->dtype);
	return (backward ? 2.0 : 1.0) * (double)(p->experts / p->ep) * w;
}

/* Table 2: B*S/(SP*CP) tokens of H + M bytes each. */
double rmoe_token_hop_bytes(const struct rmoe_routing_problem *p, int backward)
{
	double per_token = (double)p->hidden * rmoe_dtype_bytes(p->dtype) +
	                   (double)rmoe_routing_metadata_bytes(p->topk);
	return (backward ? 2.0 : 1.0) * (double)p->tokens * per_token;
}

double rmoe_token_hop_bytes_carried(const struct rmoe_routing_problem *p, int backward)
{
	double s = rmoe_dtype_bytes(p->dtype), H = (double)p->hidden, K = (double)p->topk;
	double per_token = backward ? 3.0 * H * s + 12.0 * K : 2.0 * H * s + 8.0 * K;
	return (double)p->tokens * per_token;
}

double rmoe_hop_flops(const struct rmoe_routing_problem *p, int backward)
{
	double pairs = (double)p->tokens * (double)p->topk / (double)p->ep;
	double forward = pairs * 2.0 * 3.0 * (double)p->hidden * (double)(p->ffn / p->etp);
	/* §3.3: backward reconstructs the intermediates (one forward) and runs
	 * the data and weight gradients (two more). */
	return backward ? 3.0 * forward : forward;
}

int64_t rmoe_routing_crossover_tokens(const struct rmoe_routing_problem *p)
{
	/* Both modes cross the same edges and compute the same pairs, so the
	 * choice follows the bytes of a forward and a backward hop together:
	 * experts 3 partitions (weights, then weights and gradients); tokens
	 * carried 5H*s + 20K bytes each (graph/dispatch/ring_token.c). */
	int64_t per_token = 5 * p->hidden * rmoe_dtype_bytes(p->dtype) + 20 * p->topk;
	int64_t w, vol;
	if (__builtin_mul_overflow(3 * p->hidden, (p->ffn / p->etp) * rmoe_dtype_bytes(p->dtype), &w) ||
	    __builtin_mul_overflow(w, 3 * (p->experts / p->ep), &vol))
		return INT64_MAX;
	/* Token routing while T * per_token < vol. */
	return vol / per_token + (vol % per_token != 0);
}

static void hop_cost(struct rmoe_hop_cost *c, double bytes, double flops, const struct rmoe_ring_edge *edges,
                     int n, double tflops)
{
	c->bytes = bytes;
	c->compute_s = flops / (tflops * 1e12);
	if (n > 1) {
		c->slowest_edge = rmoe_ring_slowest_edge(edges, n, bytes);
		c->transfer_s = rmoe_edge_seconds(&edges[c->slowest_edge], bytes);
	} else {
		c->slowest_edge = 0;
		c->transfer_s = 0;   /* one rank: the ring has no transfer */
	}
	c->exposed_s = fmax(0.0, c->transfer_s - c->compute_s);
	c->hidden_fraction = c->transfer_s > 0 ? fmin(c->transfer_s, c->compute_s) / c->transfer_s : 1.0;
}

static const char *human_bytes(double b, char buf[32])
{
	if (b >= 1e9)
		snprintf(buf, 32, "%.2f GB", b / 1e9);
	else if (b >= 1e6)
		snprintf(buf, 32, "%.1f MB", b / 1e6);
	else if (b >= 1e3)
		snprintf(buf, 32, "%.1f kB", b / 1e3);
	else
		snprintf(buf, 32, "%.0f B", b);
	return buf;
}

double rmoe_ring_pass_seconds(const struct rmoe_hop_cost *c, int64_t n, int backward)
{
	double s = c->compute_s + (double)(n - 1) * fmax(c->transfer_s, c->compute_s);
	if (backward && n > 1)
		s += c->transfer_s / 2;
	return s;
}

int rmoe_routing_choose(const struct rmoe_routing_problem *p, const struct rmoe_ring_edge *edges, int n,
                        double device_tflops, struct rmoe_routing_choice *out)
{
	if (!out)
		return rmoe_error(RMOE_EINVAL, "rmoe_routing_choose: out is NULL");
	memset(out, 0, sizeof(*out));
	int rc = rmoe_routing_check(p);
	if (rc)
		return rc;
	if (!edges || n != p->ep)
		return rmoe_error(RMOE_EINVAL, "%d ring edges for EP = %lld: expected one edge per rank", n,
		                  (long long)p->ep);
	if (!(device_tflops > 0) || !isfinite(device_tflops))
		return rmoe_error(RMOE_EINVAL, "device rate %g TFLOP/s: expected a positive number", device_tflops);

	out->device_tflops = device_tflops;
	out->pairs_per_hop = (double)p->tokens * (double)p->topk / (double)p->ep;
	for (int bwd = 0; bwd < 2; bwd++) {
		double flops = rmoe_hop_flops(p, bwd);
		hop_cost(&out->expert[bwd], rmoe_expert_hop_bytes(p, bwd), flops, edges, n, device_tflops);
		hop_cost(&out->token[bwd], rmoe_token_hop_bytes_carried(p, bwd), flops, edges, n, device_tflops);
		out->token_table2[bwd] = rmoe_token_hop_bytes(p, bwd);
	}
	out->crossover_tokens = rmoe_routing_crossover_tokens(p);

	double ex = out->expert[0].exposed_s + out->expert[1].exposed_s;
	double tx = out->token[0].exposed_s + out->token[1].exposed_s;
	double ev = out->expert[0].bytes + out->expert[1].bytes;
	double tv = out->token[0].bytes + out->token[1].bytes;
	double eps = 1e-9 * fmax(ex, tx);
	int token = tx < ex - eps || (fabs(tx - ex) <= eps && tv < ev);
	out->mode = token ? RMOE_DISPATCH_RING_TOKEN : RMOE_DISPATCH_RING_EXPERT;
	out->tokens_travel = token;

	char eb[32], tb[32];
	human_bytes(out->expert[0].bytes, eb);
	human_bytes(out->token[0].bytes, tb);
	const struct rmoe_ring_edge *slow = &edges[(token ? out->token : out->expert)[0].slowest_edge];
	char where[96];
	if (n > 1)
		snprintf(where, sizeof(where), "over the slowest edge (%s, %g GB/s)", rmoe_link_name(slow->link),
		         slow->bandwidth_gbs);
	else
		snprintf(where, sizeof(where), "(one rank: nothing to transfer)");
	if (token)
		snprintf(out->reason, sizeof(out->reason),
		         "token routing: %s/hop of tokens with their accumulator vs %s/hop of expert weights "
		         "forward; exposed %.3f vs %.3f ms per hop forward+backward %s; token routing below "
		         "%lld tokens per rank",
		         tb, eb, tx * 1e3, ex * 1e3, where, (long long)out->crossover_tokens);
	else
		snprintf(out->reason, sizeof(out->reason),
		         "expert routing: %s/hop of expert weights vs %s/hop of tokens with their accumulator "
		         "forward; exposed %.3f vs %.3f ms per hop forward+backward %s; expert routing from "
		         "%lld tokens per rank",
		         eb, tb, ex * 1e3, tx * 1e3, where, (long long)out->crossover_tokens);
	return 0;
}
