/* LD_PRELOAD shim that makes large host allocations fail, as on a machine
 * out of memory, so that the tests can see each failure come back as an
 * error code rather than a crash or a hang.
 *   RMOE_FAILMALLOC_ABOVE=BYTES  refuse every request larger than BYTES
 *   RMOE_FAILMALLOC_RANK=R       only in the MPI rank R (OMPI_COMM_WORLD_RANK);
 *                                unset or empty: in every process
 * Without RMOE_FAILMALLOC_ABOVE, or in another rank, it only forwards to
 * glibc. Not for sanitizer builds, which interpose the same functions. */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void *__libc_memalign(size_t align, size_t size);

/* -1: not read yet; 0: no limit; otherwise the largest request served. */
static long long limit = -1;

static size_t parse_bytes(const char *s)
{
	size_t v = 0;
	for (; *s >= '0' && *s <= '9'; s++)
		v = v * 10 + (size_t)(*s - '0');
	return v;
}

extern char **environ;

/* getenv allocates nothing, so it is safe from inside malloc; the limit is
 * read once the environment exists (the loader allocates before). */
static int refuse(size_t bytes)
{
	if (limit < 0) {
		if (!environ)
			return 0;
		const char *above = getenv("RMOE_FAILMALLOC_ABOVE");
		const char *rank = getenv("RMOE_FAILMALLOC_RANK");
		const char *mine = getenv("OMPI_COMM_WORLD_RANK");
		int here = !rank || !*rank || (mine && strcmp(rank, mine) == 0);
		limit = above && *above && here ? (long long)parse_bytes(above) : 0;
	}
	if (limit > 0 && bytes > (size_t)limit) {
		static const char note[] = "failmalloc: refused a large allocation\n";
		if (write(STDERR_FILENO, note, sizeof(note) - 1) < 0) {
			/* nothing to do: the note is only for the log */
		}
		return 1;
	}
	return 0;
}

void *malloc(size_t size)
{
	if (refuse(size)) {
		errno = ENOMEM;
		return NULL;
	}
	return __libc_malloc(size);
}

void *calloc(size_t n, size_t size)
{
	if (size && n > (size_t)-1 / size)
		return __libc_calloc(n, size);
	if (refuse(n * size)) {
		errno = ENOMEM;
		return NULL;
	}
	return __libc_calloc(n, size);
}

void *realloc(void *p, size_t size)
{
	if (refuse(size)) {
		errno = ENOMEM;
		return NULL;
	}
	return __libc_realloc(p, size);
}

int posix_memalign(void **out, size_t align, size_t size)
{
	if (refuse(size))
		return ENOMEM;
	void *p = __libc_memalign(align, size);
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

void *aligned_alloc(size_t align, size_t size)
{
	if (refuse(size)) {
		errno = ENOMEM;
		return NULL;
	}
	return __libc_memalign(align, size);
}

void *memalign(size_t align, size_t size)
{
	if (refuse(size)) {
		errno = ENOMEM;
		return NULL;
	}
	return __libc_memalign(align, size);
}
