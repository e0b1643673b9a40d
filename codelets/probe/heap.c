/* Heap probe: the bytes the process has malloc'ed, from glibc, as a figure
 * independent of StarPU's accounting (probe.c), with a running maximum.
 *
 * mallinfo2() gives uordblks (bytes in use in every arena, brk and
 * mmap'ed heaps alike) and hblkhd (chunks malloc served by a mapping of
 * their own): their sum is every malloc, calloc, realloc and
 * posix_memalign still held, whoever made it: StarPU's host buffers,
 * codelet scratch (the fp32 copies of bf16 operands), StarPU's task and
 * handle structures, StarPU-MPI's and Open MPI's request and
 * unexpected-message buffers (less the host cache's idle blocks and class
 * slack, host_cache.c). Not in it: memory mapped without malloc. Two such
 * pools matter here, and both are mapped before a measured pass and never
 * grow with it:
 * - OpenBLAS's GEMM workspace: a pool of per-thread buffers that
 *   blas_memory_alloc mmaps on a thread's first level-3 call and keeps
 *   (BUFFER_SIZE each: 128 MiB of address space in Debian's 0.3.21,
 *   DYNAMIC_ARCH; what a GEMM touches of it is its packing blocks, a few
 *   MiB). A fixed pool per BLAS thread, outside the figure.
 * - Open MPI's shared-memory segments (the vader BTL's per-peer FIFOs and
 *   fragments), mapped at MPI_Init; rendezvous messages land in the
 *   receiver's buffer, which is malloc'ed and counted.
 * Thread stacks (the sampler's included) are mappings too. */
#include <stdatomic.h>
#include <stddef.h>

#include "rmoe_cl_probe.h"

/* The simulation build compiles with SMPI's helpers, which replace malloc
 * by a macro that <malloc.h>'s declarations cannot take: nothing is
 * measured there (a simulation allocates folded memory, and no task runs). */
#ifndef STARPU_SIMGRID
#include <malloc.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define RMOE_HEAP_FROM_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RMOE_HEAP_FROM_SANITIZER 1
#endif
#endif
#ifdef RMOE_HEAP_FROM_SANITIZER
/* The sanitizer runtime's own count (sanitizer/allocator_interface.h, a
 * header GCC's packages do not ship). */
size_t __sanitizer_get_current_allocated_bytes(void);
#endif

static _Atomic int64_t heap_peak;

#if !defined(STARPU_SIMGRID)
/* The allocator's count of the bytes in use. Under AddressSanitizer malloc
 * is the sanitizer's, which glibc's arenas never see: its own count of the
 * bytes allocated and not yet freed is the same figure (the hardening stage
 * runs the suite so). */
static int64_t allocated_now(void)
{
#if defined(RMOE_HEAP_FROM_SANITIZER)
	return (int64_t)__sanitizer_get_current_allocated_bytes();
#else
	struct mallinfo2 m = mallinfo2();
	return (int64_t)(m.uordblks + m.hblkhd);
#endif
}
#endif

int64_t rmoe_heap_current(void)
{
#if defined(STARPU_SIMGRID)
	return 0;
#else
	/* The host cache's idle blocks and class slack (host_cache.c) are
	 * allocator policy, like glibc's free lists, which uordblks leaves
	 * out too. */
	return rmoe_host_cache_heap(allocated_now);
#endif
}

int64_t rmoe_heap_sample(void)
{
	int64_t now = rmoe_heap_current();
	int64_t peak = atomic_load_explicit(&heap_peak, memory_order_relaxed);
	while (now > peak && !atomic_compare_exchange_weak_explicit(&heap_peak, &peak, now, memory_order_relaxed,
	                                                            memory_order_relaxed))
		;
	return now;
}

int64_t rmoe_heap_reset(void)
{
	int64_t now = rmoe_heap_current();
	atomic_store(&heap_peak, now);
	return now;
}

int64_t rmoe_heap_peak(void)
{
	return atomic_load(&heap_peak);
}
