/* Chunks of a partition's pairs: at most the chunk rows each (the memory
 * cap's, or the configuration's), never across two of a rank's
 * partitions. */
#include <stdlib.h>

#include "rmoe_chunks.h"

/* The chunks of the pairs [first, first + total): at most max_rows rows
 * each (0: one), appended at c + *n. */
static int append_chunks(const struct rmoe_layer *L, const int64_t *offsets, int64_t e0, int64_t first,
                         int64_t total, int64_t max_rows, struct rmoe_chunk *c, int64_t *n)
{
	if (max_rows <= 0 || max_rows > total)
		max_rows = total;
	for (int64_t at = first; at < first + total; at += max_rows) {
		struct rmoe_chunk *k = &c[(*n)++];
		k->first = at;
		k->rows = first + total - at < max_rows ? first + total - at : max_rows;
		k->rows_per_expert = calloc((size_t)L->e_local, sizeof(int64_t));
		if (!k->rows_per_expert)
			return -1;
		for (int64_t e = 0; e < L->e_local; e++) {
			int64_t a = offsets[e0 + e], b = offsets[e0 + e + 1];
			int64_t s = a > at ? a : at, t = b < at + k->rows ? b : at + k->rows;
			k->rows_per_expert[e] = t > s ? t - s : 0;
		}
	}
	return 0;
}

int64_t rmoe_partition_chunks(const struct rmoe_layer *L, const int64_t *offsets, int p, int64_t max_rows,
                              struct rmoe_chunk **chunks)
{
	const int64_t e0 = (int64_t)p * L->e_local;
	const int64_t parts = L->cfg.partitions > 1 ? L->cfg.partitions : 1, per = L->e_local / parts;
	*chunks = NULL;
	if (rmoe_pairs_count(offsets, e0, L->e_local) == 0)
		return 0;
	/* Each of the rank's partitions (hops on one device) is chunked on its
	 * own: a chunk never spans two, and one's rows are gone before the
	 * next's are gathered (the window). */
	int64_t cap = 0;
	for (int64_t g = 0; g < parts; g++) {
		int64_t total = rmoe_pairs_count(offsets, e0 + g * per, per);
		int64_t m = max_rows > 0 && max_rows < total ? max_rows : total;
		cap += m > 0 ? (total + m - 1) / m : 0;
	}
	struct rmoe_chunk *c = calloc((size_t)cap, sizeof(*c));
	int64_t n = 0;
	int rc = c ? 0 : -1;
	for (int64_t g = 0; g < parts && !rc; g++)
		rc = append_chunks(L, offsets, e0, rmoe_pairs_first(offsets, e0 + g * per),
		                   rmoe_pairs_count(offsets, e0 + g * per, per), max_rows, c, &n);
	if (rc) {
		rmoe_chunks_free(c, n);
		return -1;
	}
	*chunks = c;
	return n;
}

void rmoe_chunks_free(struct rmoe_chunk *chunks, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		free(chunks[i].rows_per_expert);
	free(chunks);
}
