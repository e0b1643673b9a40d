/* Synthetic routing for StarPU's SimGrid mode. No kernel runs there, so the
 * router's expert counts, which the host reads to size every hop (the one
 * synchronisation point of a forward), do not exist. They are drawn instead:
 * uniform expected load, T*K/E pairs per expert, with a seeded jitter whose
 * spread is that of a uniform random router (about sqrt(T*K/E) pairs), and
 * exactly T*K pairs in all. The draw depends only on the layer's shape, the
 * rank and the seed, so every rank computes every other rank's counts alike
 * (the counts exchange of the all-to-all and the token ring must agree).
 *   RMOE_SIM_SEED    seed of the draw (default 1)
 *   RMOE_SIM_JITTER  spread as a fraction of T*K/E instead (0: exactly even)
 * Compiled in every build; only the simulated one calls it. */
#include <math.h>
#include <stdlib.h>

#include "rmoe_hash.h"
#include "rmoe_memory_model.h"
#include "rmoe_transfers.h"
#include "rmoe_system.h"


void rmoe_sim_expert_counts(int64_t tokens, int64_t topk, int64_t experts, int rank, int32_t *counts)
{
	const int64_t pairs = tokens * topk, base = pairs / experts, rem = pairs % experts;
	for (int64_t e = 0; e < experts; e++)
		counts[e] = (int32_t)(base + (e < rem ? 1 : 0));
	if (experts < 2)
		return;
	const char *s = rmoe_env(RMOE_ENV_SIM_SEED);
	uint64_t seed = s && *s ? strtoull(s, NULL, 10) : 1;
	const char *j = rmoe_env(RMOE_ENV_SIM_JITTER);
	double spread = j && *j ? atof(j) * (double)base : sqrt((double)base);
	int64_t width = spread > 0 ? (int64_t)llround(spread) : 0;
	if (width <= 0)
		return;
	/* Moves of up to width pairs between expert pairs keep the total; a
	 * token picks an expert at most once, so no count passes T. */
	uint64_t state = rmoe_splitmix64(seed ^ rmoe_splitmix64((uint64_t)rank + 0x5157ull));
	for (int64_t e = 0; e < experts; e++) {
		state = rmoe_splitmix64(state);
		int64_t to = (e + 1 + (int64_t)(state % (uint64_t)(experts - 1))) % experts;
		state = rmoe_splitmix64(state);
		int64_t d = (int64_t)(state % (uint64_t)(2 * width + 1)) - width;
		if (d > 0) {
			d = d < counts[e] ? d : counts[e];
			d = d < tokens - counts[to] ? d : tokens - counts[to];
			counts[e] -= (int32_t)d;
			counts[to] += (int32_t)d;
		} else if (d < 0) {
			d = -d < counts[to] ? -d : counts[to];
			d = d < tokens - counts[e] ? d : tokens - counts[e];
			counts[to] -= (int32_t)d;
			counts[e] += (int32_t)d;
		}
	}
}

void rmoe_sim_peer_tokens(int64_t tokens, int64_t topk, int64_t experts, int64_t ranks, const int32_t *counts,
                          int32_t *out)
{
	/* A uniform router's distinct tokens per pair (the memory model's),
	 * applied to the drawn pairs, within what the pairs allow. */
	const int64_t el = experts / ranks;
	const double ratio = rmoe_uniform_tokens_per_pair(topk, experts, el);
	for (int64_t q = 0; q < ranks; q++) {
		int64_t pairs = 0;
		for (int64_t e = q * el; e < (q + 1) * el; e++)
			pairs += counts[e];
		out[q] = (int32_t)rmoe_block_tokens_within(llround(ratio * (double)pairs), pairs, tokens, topk, el);
	}
}
