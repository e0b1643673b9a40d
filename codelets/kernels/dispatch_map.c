/* Dispatch map (CPU): the pairs of all tokens sorted by expert (stable
 * counting sort), so that one partition's pairs are one slice of
 * pair_order. */
#include <string.h>

#include "rmoe_kernels.h"

int64_t rmoe_kernel_dispatch_map(int64_t P, int64_t E, const int32_t *topk_idx, int32_t *pair_order,
                                 int32_t *counts)
{
	memset(counts, 0, (size_t)E * sizeof(int32_t));
	for (int64_t p = 0; p < P; p++) {
		if (topk_idx[p] < 0 || topk_idx[p] >= E)
			return p;
		counts[topk_idx[p]]++;
	}
	/* counts become start offsets, advanced while placing: each ends at the
	 * start of the next expert, from which the counts come back. */
	int32_t start = 0;
	for (int64_t e = 0; e < E; e++) {
		int32_t c = counts[e];
		counts[e] = start;
		start += c;
	}
	for (int64_t p = 0; p < P; p++)
		pair_order[counts[topk_idx[p]]++] = (int32_t)p;
	for (int64_t e = E - 1; e > 0; e--)
		counts[e] -= counts[e - 1];
	return -1;
}
