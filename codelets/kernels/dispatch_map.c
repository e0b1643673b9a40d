/* Dispatch map (CPU): the pairs of all tokens sorted by expert (stable
 * counting sort), so that one partition's pairs are one slice of
 * pair_order. */
#include <stdlib.h>
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

int64_t rmoe_kernel_peer_counts(int64_t T, int64_t K, int64_t E, int64_t N, const int32_t *topk_idx,
                                const int32_t *counts, int32_t *out)
{
	const int64_t el = E / N;
	memcpy(out, counts, (size_t)E * sizeof(int32_t));
	memset(out + E, 0, (size_t)N * sizeof(int32_t));
	for (int64_t t = 0; t < T; t++)
		for (int64_t k = 0; k < K; k++) {
			const int32_t e = topk_idx[t * K + k];
			if (e < 0 || e >= E)
				return t * K + k;
			/* Counted at the token's first pair for that rank. */
			int seen = 0;
			for (int64_t j = 0; j < k && !seen; j++)
				seen = topk_idx[t * K + j] / el == e / el;
			if (!seen)
				out[E + e / el]++;
		}
	return -1;
}

static int32_t lower_bound(const int32_t *v, int64_t n, int32_t x)
{
	int64_t lo = 0, hi = n;
	while (lo < hi) {
		int64_t mid = lo + (hi - lo) / 2;
		if (v[mid] < x)
			lo = mid + 1;
		else
			hi = mid;
	}
	return (int32_t)lo;
}

static int cmp_i32(const void *a, const void *b)
{
	const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
	return (x > y) - (x < y);
}

int64_t rmoe_kernel_dedup_map(int64_t K, int64_t first, int64_t count, const int32_t *pair_order, int64_t distinct,
                              int32_t *tokens, int32_t *codes)
{
	/* The block's tokens sorted, the repeats dropped; codes as scratch
	 * first (count entries), then each pair's slot among them. */
	for (int64_t i = 0; i < count; i++)
		codes[i] = (int32_t)(pair_order[first + i] / K);
	qsort(codes, (size_t)count, sizeof(int32_t), cmp_i32);
	int64_t n = 0;
	for (int64_t i = 0; i < count; i++)
		if (i == 0 || codes[i] != codes[i - 1]) {
			if (n == distinct)
				return -1;
			tokens[n++] = codes[i];
		}
	if (n != distinct)
		return -1;
	for (int64_t i = 0; i < count; i++) {
		const int32_t p = pair_order[first + i];
		codes[i] = lower_bound(tokens, n, (int32_t)(p / K)) * (int32_t)K + (int32_t)(p % K);
	}
	return 0;
}
