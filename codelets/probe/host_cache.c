/* StarPU's main-memory buffers through a cache of freed blocks.
 *
 * StarPU 1.3 frees a temporary's main-memory buffer as soon as its handle
 * is unregistered (it caches device buffers only), and glibc serves every
 * block of 32 MiB or more by a mapping of its own, which free unmaps. Every
 * pass of a layer therefore got fresh pages for its gathered rows, SwiGLU
 * intermediates and outputs, and the kernel zeroed each on its first touch:
 * at H=1024, F=512, E=8, K=2, 4096 tokens on one rank, 47 000 page faults
 * per pass (186 MiB of 4 KiB pages), charged to the first GEMM writing an
 * output (OpenBLAS's sgemm_beta), the kernels' first writes and the
 * gathers' copies: a fifth of the pass's time (bench/results/rate.md).
 *
 * So StarPU allocates main memory through these hooks (starpu_malloc_set_
 * hooks). A block of 1 MiB or more has its size rounded up to a class
 * (an eighth of an octave: at most 12.5% over, rmoe_size_class), and its
 * 2 MiB-aligned part is advised into transparent huge pages (MADV_HUGEPAGE:
 * one fault per 2 MiB where the kernel grants them, "madvise" or "always"
 * in /sys/kernel/mm/transparent_hugepage/enabled). A freed block is kept idle and serves the
 * next request of its class, or of a class down to two thirds of it (a
 * pass's forward and backward ask for different sizes). The cache never
 * makes the process hold more than its own peak: before a fresh block is
 * mapped, idle blocks are unmapped until live + idle + the new block is at
 * most the high-water mark of live bytes (or the new live total, where
 * that is a new peak): idle blocks are freed. RMOE_HOST_CACHE=off turns it off; RMOE_HOST_CACHE=
 * BYTES caps the idle bytes besides.
 *
 * Installed only where the context starts StarPU itself (before
 * starpu_init: every buffer StarPU frees was allocated here), never beside
 * CUDA workers (StarPU pins main memory for them with cudaHostAlloc, which
 * the hooks would have to replace) and never under simulation (folded
 * allocations). StarPU's own accounting (starpu_memory_allocate) happens
 * before the hook and is unchanged; the heap probe (heap.c) leaves the
 * idle blocks and the classes' slack out, as mallinfo2 leaves glibc's free
 * lists out. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "rmoe_cl_probe.h"
#include "rmoe_scheduler.h"

#define CACHE_MIN_BYTES ((int64_t)1 << 20)
#define HUGE_BYTES ((int64_t)2 << 20)
#define SMALL_ALIGN 64

struct block {
	void *p;
	int64_t bytes; /* allocated (its class) */
	int64_t want;  /* asked for, while live */
};

struct blocks {
	struct block *b;
	int n, cap;
};

static struct {
	pthread_mutex_t lock;
	int installed;
	int64_t cap;         /* idle bytes at most; 0: the high-water mark only */
	struct blocks idle;  /* oldest first */
	struct blocks live;
	int64_t idle_bytes, live_bytes, live_want, hwm;
	int64_t hits, misses;
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

int64_t rmoe_size_class(int64_t bytes)
{
	if (bytes <= 4096)
		return 4096;
	int s = 63 - __builtin_clzll((unsigned long long)bytes);
	int64_t step = (int64_t)1 << (s - 3);
	return (bytes + step - 1) / step * step;
}

static int blocks_push(struct blocks *l, struct block b)
{
	if (l->n == l->cap) {
		int n = l->cap ? 2 * l->cap : 32;
		struct block *a = realloc(l->b, (size_t)n * sizeof(*a));
		if (!a)
			return -1;
		l->b = a;
		l->cap = n;
	}
	l->b[l->n++] = b;
	return 0;
}

static struct block blocks_take(struct blocks *l, int i)
{
	struct block b = l->b[i];
	memmove(l->b + i, l->b + i + 1, (size_t)(l->n - i - 1) * sizeof(*l->b));
	l->n--;
	return b;
}

/* A block from malloc (so that a process's allocation limits and a test's
 * refusals apply to it as to any), its 2 MiB-aligned interior advised
 * into huge pages: glibc maps a large block by itself at a page offset,
 * so a 48 MiB block gets 23 huge pages of 24. */
static void *new_block(int64_t bytes)
{
	void *p = malloc((size_t)bytes);
#ifdef MADV_HUGEPAGE
	const uintptr_t huge = (uintptr_t)HUGE_BYTES;
	const uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1), e = ((uintptr_t)p + (uintptr_t)bytes) & ~(huge - 1);
	/* Advice only: where transparent huge pages are off the block stays
	 * in small pages. */
	if (p && e > a)
		(void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#endif
	return p;
}

/* Frees the oldest idle block; under the lock. */
static void evict_oldest(void)
{
	struct block b = blocks_take(&cache.idle, 0);
	cache.idle_bytes -= b.bytes;
	free(b.p);
}

/* The idle block that serves a request of class `bytes`: the smallest of
 * at least that class and at most 3/2 of it, the most recently freed among
 * equals (warm in the CPU's caches); -1 for none. Under the lock. */
static int idle_fit(int64_t bytes)
{
	int best = -1;
	for (int i = cache.idle.n - 1; i >= 0; i--) {
		const int64_t b = cache.idle.b[i].bytes;
		if (b >= bytes && 2 * b <= 3 * bytes && (best < 0 || b < cache.idle.b[best].bytes))
			best = i;
	}
	return best;
}

static int cache_malloc(unsigned node, void **A, size_t dim, int flags)
{
	(void)node;
	(void)flags;
	const int64_t want = (int64_t)dim;
	if (want < CACHE_MIN_BYTES) {
		void *p = NULL;
		*A = posix_memalign(&p, SMALL_ALIGN, want > 0 ? (size_t)want : 1) == 0 ? p : NULL;
		return *A ? 0 : -ENOMEM;
	}
	const int64_t bytes = rmoe_size_class(want);
	struct block b = {NULL, 0, want};
	pthread_mutex_lock(&cache.lock);
	const int i = idle_fit(bytes);
	if (i >= 0) {
		b.p = cache.idle.b[i].p;
		b.bytes = cache.idle.b[i].bytes;
		blocks_take(&cache.idle, i);
		cache.idle_bytes -= b.bytes;
		cache.hits++;
	} else {
		while (cache.idle.n > 0 && cache.live_bytes + cache.idle_bytes + bytes > cache.hwm)
			evict_oldest();
		b.bytes = bytes;
		b.p = new_block(bytes);
		while (!b.p && cache.idle.n > 0) {
			evict_oldest();
			b.p = new_block(bytes);
		}
		cache.misses++;
	}
	if (b.p && blocks_push(&cache.live, b)) {
		free(b.p);
		b.p = NULL;
	}
	if (b.p) {
		cache.live_bytes += b.bytes;
		cache.live_want += want;
		if (cache.live_bytes > cache.hwm)
			cache.hwm = cache.live_bytes;
	}
	pthread_mutex_unlock(&cache.lock);
	*A = b.p;
	return b.p ? 0 : -ENOMEM;
}

static int cache_free(unsigned node, void *A, size_t dim, int flags)
{
	(void)node;
	(void)flags;
	if (!A)
		return 0;
	if ((int64_t)dim < CACHE_MIN_BYTES) {
		free(A);
		return 0;
	}
	pthread_mutex_lock(&cache.lock);
	int i = cache.live.n - 1;
	while (i >= 0 && cache.live.b[i].p != A)
		i--;
	if (i < 0) { /* not ours: StarPU frees only what it allocated */
		pthread_mutex_unlock(&cache.lock);
		return -EINVAL;
	}
	struct block b = blocks_take(&cache.live, i);
	cache.live_bytes -= b.bytes;
	cache.live_want -= b.want;
	if (blocks_push(&cache.idle, b) == 0) {
		cache.idle_bytes += b.bytes;
		while (cache.cap > 0 && cache.idle_bytes > cache.cap)
			evict_oldest();
	} else {
		free(b.p);
	}
	pthread_mutex_unlock(&cache.lock);
	return 0;
}

int rmoe_host_cache_install(const char *setting)
{
#ifdef STARPU_SIMGRID
	/* Folded allocations: nothing to cache, no hooks. */
	(void)setting;
	(void)cache_malloc;
	(void)cache_free;
	return 0;
#else
	int64_t cap = 0;
	if (setting && *setting && strcmp(setting, "auto")) {
		if (!strcmp(setting, "off") || !strcmp(setting, "0"))
			return 0;
		if (rmoe_parse_bytes(setting, &cap))
			return rmoe_error(RMOE_EINVAL, "RMOE_HOST_CACHE='%s': expected off, auto or a size such as 512M",
			                  setting);
	}
	pthread_mutex_lock(&cache.lock);
	cache.installed = 1;
	cache.cap = cap;
	pthread_mutex_unlock(&cache.lock);
	starpu_malloc_set_hooks(cache_malloc, cache_free);
	return 0;
#endif
}

void rmoe_host_cache_uninstall(void)
{
	pthread_mutex_lock(&cache.lock);
	while (cache.idle.n > 0)
		evict_oldest();
	if (cache.installed) {
		/* Blocks still live (an application's starpu_malloc, freed after
		 * the context) are malloc's: StarPU's default free takes them. */
		starpu_malloc_set_hooks(NULL, NULL);
		free(cache.idle.b);
		free(cache.live.b);
		cache.idle = cache.live = (struct blocks){0};
		cache.live_bytes = cache.live_want = cache.hwm = 0;
		cache.installed = 0;
	}
	pthread_mutex_unlock(&cache.lock);
}

void rmoe_host_cache_stats(struct rmoe_host_cache_stats *s)
{
	pthread_mutex_lock(&cache.lock);
	s->installed = cache.installed;
	s->idle_bytes = cache.idle_bytes;
	s->live_bytes = cache.live_bytes;
	s->live_want = cache.live_want;
	s->hwm_bytes = cache.hwm;
	s->hits = cache.hits;
	s->misses = cache.misses;
	pthread_mutex_unlock(&cache.lock);
}

int64_t rmoe_host_cache_heap(int64_t (*allocated)(void))
{
	/* Under the lock, which every allocation and free of the cache holds:
	 * a block freed between the two reads (an eviction: ASan poisons a
	 * large block's shadow for tens of microseconds) would otherwise be
	 * counted by the allocator and left out of the idle bytes, and the
	 * sampler's peak would keep that moment. */
	pthread_mutex_lock(&cache.lock);
	int64_t heap = allocated() - (cache.idle_bytes + cache.live_bytes - cache.live_want);
	pthread_mutex_unlock(&cache.lock);
	return heap;
}
