/* Chunks of a partition's pairs (chunks.c). Private to graph/. */
#ifndef RMOE_CHUNKS_H
#define RMOE_CHUNKS_H

#include <stdint.h>

#include "rmoe_layer_impl.h"

/* Pairs routed to the experts [e0, e0+ne): their slice of a pair order with
 * per-expert offsets. */
static inline int64_t rmoe_pairs_first(const int64_t *offsets, int64_t e0)
{
	return offsets[e0];
}
static inline int64_t rmoe_pairs_count(const int64_t *offsets, int64_t e0, int64_t ne)
{
	return offsets[e0 + ne] - offsets[e0];
}

/* One chunk of a partition's pairs: rows [first, first+rows) of pair_order,
 * with the rows of each local expert. */
struct rmoe_chunk {
	int64_t first, rows;
	int64_t *rows_per_expert;     /* e_local entries */
};

/* Split the pairs routed to expert partition p (of the token partition whose
 * offsets are given) into chunks of at most max_rows rows (0 = one chunk),
 * each within one of the layer's partitions of p's experts
 * (cfg.partitions). Returns the count; *chunks is malloc'ed. No pair gives
 * 0 chunks. */
int64_t rmoe_partition_chunks(const struct rmoe_layer *L, const int64_t *offsets, int p, int64_t max_rows,
                              struct rmoe_chunk **chunks);
void rmoe_chunks_free(struct rmoe_chunk *chunks, int64_t n);

#endif /* RMOE_CHUNKS_H */
