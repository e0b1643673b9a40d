/* Stream s of seed is the splitmix64 sequence started from a state derived
 * from (seed, s); its value i is computed directly from i, with integer
 * arithmetic and exact float scaling only, so every machine and every slice
 * agrees bit for bit. */
#include <math.h>

#include "rmoe_hash.h"
#include "seeded.h"

/* Mixing seed before stream keeps (seed, s) and (seed', s') apart when
 * seed ^ s == seed' ^ s'. */
static uint64_t stream_state(uint64_t seed, uint64_t stream)
{
	return rmoe_mix64(rmoe_mix64(seed + RMOE_GOLDEN_GAMMA) ^ (stream * RMOE_GOLDEN_GAMMA));
}

static uint64_t draw(uint64_t state, uint64_t index)
{
	return rmoe_mix64(state + (index + 1) * RMOE_GOLDEN_GAMMA);
}

uint64_t rmoe_seeded_u64(uint64_t seed, uint64_t stream, uint64_t index)
{
	return draw(stream_state(seed, stream), index);
}

void rmoe_seeded_uniform(float *dst, int64_t n, uint64_t seed, uint64_t stream, int64_t offset,
                         float scale)
{
	const uint64_t state = stream_state(seed, stream);
	const float limit = nextafterf(scale, 0.0f);
	for (int64_t i = 0; i < n; i++) {
		const int32_t k = (int32_t)(draw(state, (uint64_t)offset + (uint64_t)i) >> 40) - (1 << 23);
		/* k * 2^-23 * scale is exact in double (24 x 24 bits), so the only
		 * rounding is the final one to float; it can reach scale itself. */
		float v = (float)((double)k * 0x1p-23 * (double)scale);
		if (scale > 0.0f && v > limit)
			v = limit;
		dst[i] = v;
	}
}
