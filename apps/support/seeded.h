/* Seeded, counter-based random tensors: value i of stream s under seed is a
 * pure function of (seed, s, i), so every rank draws the same global tensor
 * (or its own slice of it) without communication, and tests can redraw it. */
#ifndef RMOE_SEEDED_H
#define RMOE_SEEDED_H

#include <stdint.h>

/* Streams of one layer's tensors. */
enum rmoe_stream {
	RMOE_STREAM_X = 1,
	RMOE_STREAM_DY = 2,
	RMOE_STREAM_W_ROUTER = 3,
	RMOE_STREAM_W_GATE = 4,
	RMOE_STREAM_W_UP = 5,
	RMOE_STREAM_W_DOWN = 6,
	RMOE_STREAM_WS_GATE = 7,
	RMOE_STREAM_WS_UP = 8,
	RMOE_STREAM_WS_DOWN = 9,
	RMOE_STREAM_W_SHARED_EXPERT_GATE = 10,
	RMOE_STREAM_USER = 64,         /* first stream free for other uses */
};

/* Uniform in [-scale, scale): dst[i] = value(seed, stream, offset + i). */
void rmoe_seeded_uniform(float *dst, int64_t n, uint64_t seed, uint64_t stream, int64_t offset,
                         float scale);

/* One 64-bit draw (splitmix64 of the triple). */
uint64_t rmoe_seeded_u64(uint64_t seed, uint64_t stream, uint64_t index);

#endif
