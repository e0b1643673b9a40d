/* The hashes and random streams of relaymoe, written once: FNV-1a for the
 * digests ranks compare (configurations, plans), splitmix64 for seeded
 * streams (the programs' tensors, the simulation's synthetic routing, the
 * tests' inputs). Header-only so that every layer, the programs and the
 * tests share the one definition. */
#ifndef RMOE_HASH_H
#define RMOE_HASH_H

#include <stddef.h>
#include <stdint.h>

#define RMOE_GOLDEN_GAMMA 0x9e3779b97f4a7c15ULL

/* FNV-1a, 64 bits. */
static inline uint64_t rmoe_hash_init(void)
{
	return 14695981039346656037ULL;
}

static inline uint64_t rmoe_hash_bytes(uint64_t h, const void *data, size_t len)
{
	const unsigned char *p = (const unsigned char *)data;
	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 1099511628211ULL;
	}
	return h;
}

/* The 8 bytes of v, least significant first (the same on every host). */
static inline uint64_t rmoe_hash_i64(uint64_t h, int64_t v)
{
	for (int i = 0; i < 8; i++) {
		h ^= (uint64_t)((v >> (8 * i)) & 0xff);
		h *= 1099511628211ULL;
	}
	return h;
}

/* splitmix64's output function (Steele, Lea and Flood). */
static inline uint64_t rmoe_mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* One splitmix64 step from x: the next value of the sequence whose state
 * was x. */
static inline uint64_t rmoe_splitmix64(uint64_t x)
{
	return rmoe_mix64(x + RMOE_GOLDEN_GAMMA);
}

#endif /* RMOE_HASH_H */
