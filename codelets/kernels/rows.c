/* Row kernels (CPU) over a slice of the pair order: the gather of a hop's
 * rows, the weighted scatter-add of its outputs (the combine), and the
 * all-to-all's combine backward. */
#include <string.h>

#include "rmoe_kernels.h"

int64_t rmoe_kernel_first_bad_pair(const int32_t *pair_order, int64_t first, int64_t count, int64_t n_pairs)
{
	for (int64_t i = 0; i < count; i++)
		if (pair_order[first + i] < 0 || pair_order[first + i] >= n_pairs)
			return i;
	return -1;
}

/* Accumulated in double: dg sums H terms of mixed signs. */
static double dot(const float *a, const float *b, int64_t n)
{
	double s = 0.0;
	for (int64_t i = 0; i < n; i++)
		s += (double)a[i] * (double)b[i];
	return s;
}

void rmoe_kernel_gather(int64_t H, int64_t K, int64_t first, int64_t count, const float *src,
                        const int32_t *pair_order, const float *topk_w, float *rows)
{
	for (int64_t i = 0; i < count; i++) {
		int64_t p = pair_order[first + i];
		const float *s = src + p / K * H;
		float *r = rows + i * H;
		if (topk_w) {
			float g = topk_w[p];
			for (int64_t j = 0; j < H; j++)
				r[j] = g * s[j];
		} else {
			memcpy(r, s, (size_t)H * sizeof(float));
		}
	}
}

void rmoe_kernel_scatter_add(int64_t H, int64_t K, int64_t first, int64_t count, const float *rows,
                             const int32_t *pair_order, const float *topk_w, float *dst)
{
	for (int64_t i = 0; i < count; i++) {
		int64_t p = pair_order[first + i];
		float g = topk_w ? topk_w[p] : 1.0f;
		const float *r = rows + i * H;
		float *d = dst + p / K * H;
		for (int64_t j = 0; j < H; j++)
			d[j] += g * r[j];
	}
}

void rmoe_kernel_unpermute_bwd(int64_t H, int64_t K, int64_t first, int64_t count, const float *dy,
                               const float *back, const int32_t *pair_order, const float *topk_w,
                               float *dout, float *dg)
{
	for (int64_t i = 0; i < count; i++) {
		int64_t p = pair_order[first + i];
		const float *dyt = dy + (p / K) * H;
		const float g = topk_w[p];
		float *d = dout + i * H;
		for (int64_t j = 0; j < H; j++)
			d[j] = g * dyt[j];
		dg[p] = (float)dot(dyt, back + i * H, H);
	}
}
