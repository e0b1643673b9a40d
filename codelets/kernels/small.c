/* Small kernels (CPU): in-place accumulation and zeroing (the ring's
 * partial gradients, an empty contribution), and the all-to-all's sort of
 * received chunks by local expert and its inverse. */
#include <string.h>

#include "rmoe_kernels.h"

void rmoe_kernel_to_bf16(int64_t n, const float *src, uint16_t *dst)
{
	for (int64_t i = 0; i < n; i++)
		dst[i] = rmoe_bf16_from_float(src[i]);
}

void rmoe_kernel_from_bf16(int64_t n, const uint16_t *src, float *dst)
{
	for (int64_t i = 0; i < n; i++)
		dst[i] = rmoe_float_from_bf16(src[i]);
}

void rmoe_kernel_accumulate(int64_t n, const float *src, float *dst)
{
	for (int64_t i = 0; i < n; i++)
		dst[i] += src[i];
}

void rmoe_kernel_zero(int64_t n, float *dst)
{
	memset(dst, 0, (size_t)n * sizeof(float));
}

void rmoe_kernel_copy_pad(int64_t n_src, int64_t n_dst, const float *src, float *dst)
{
	const int64_t n = n_src < n_dst ? n_src : n_dst;
	if (n > 0)
		memcpy(dst, src, (size_t)n * sizeof(float));
	if (n_dst > n)
		memset(dst + n, 0, (size_t)(n_dst - n) * sizeof(float));
}

void rmoe_kernel_sort_chunks(int64_t H, int64_t n_peers, int64_t ne, const int64_t *counts, int sort,
                             float *const *peer, float *sorted)
{
	/* Chunk (q, e) starts in the sorted buffer after every chunk of the
	 * experts before e, and after the chunks of e from the peers before q. */
	int64_t at = 0;
	for (int64_t e = 0; e < ne; e++)
		for (int64_t q = 0; q < n_peers; q++) {
			const int64_t *peer_counts = counts + q * ne;
			if (!peer[q])
				continue;
			float *chunk = peer[q] + rmoe_sort_rows_before(counts, ne, q, e) * H;
			size_t bytes = (size_t)(peer_counts[e] * H) * sizeof(float);
			if (bytes) {
				if (sort)
					memcpy(sorted + at * H, chunk, bytes);
				else
					memcpy(chunk, sorted + at * H, bytes);
			}
			at += peer_counts[e];
		}
}
