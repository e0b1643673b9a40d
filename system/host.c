/* Host probes: what this process may hold in memory, and its peak RSS.
 * Plain Linux interfaces (sysconf, cgroup files, rlimits, /proc). */
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

#include "rmoe_config.h"
/* Not in the simulation: smpicc defines malloc as a macro, which <malloc.h>
 * cannot be read after; a simulated process's RSS means nothing anyway. */
#if defined(__GLIBC__) && !defined(RMOE_SIMGRID)
#include <malloc.h>
#endif

#include "rmoe_system.h"

/* The memory limit of this process's cgroup (v2, then v1); -1 when none. */
static double cgroup_limit(void)
{
	static const char *const files[] = {"/sys/fs/cgroup/memory.max",
	                                    "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
	for (unsigned i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		FILE *f = fopen(files[i], "r");
		if (!f)
			continue;
		unsigned long long v;
		int got = fscanf(f, "%llu", &v);
		fclose(f);
		/* "max", or v1's "unlimited" (a number near 2^63) */
		if (got == 1 && v < (1ULL << 60))
			return (double)v;
	}
	return -1;
}

int64_t rmoe_host_vm_bytes(void)
{
	long long vm_pages = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (f) {
		if (fscanf(f, "%lld", &vm_pages) != 1)
			vm_pages = 0;
		fclose(f);
	}
	long page = sysconf(_SC_PAGESIZE);
	return (int64_t)vm_pages * (page > 0 ? page : 4096);
}

double rmoe_host_memory_available(int ranks_on_node, char *why, size_t len)
{
	double avail = -1;
	const int ranks = ranks_on_node > 0 ? ranks_on_node : 1;
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	if (pages > 0 && page > 0) {
		avail = (double)pages * (double)page / ranks;
		snprintf(why, len, "the node's %.1f GiB of memory shared by its %d rank(s)",
		         (double)pages * (double)page / 1073741824.0, ranks);
	}
	double cg = cgroup_limit();
	if (cg >= 0 && (avail < 0 || cg / ranks < avail)) {
		avail = cg / ranks;
		snprintf(why, len, "the job's cgroup memory limit of %.1f GiB shared by %d rank(s)", cg / 1073741824.0,
		         ranks);
	}
	struct rlimit rl;
	if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
		double left = (double)rl.rlim_cur - (double)rmoe_host_vm_bytes();
		if (left < 0)
			left = 0;
		if (avail < 0 || left < avail) {
			avail = left;
			snprintf(why, len, "%.2f GiB of address space left under its limit (ulimit -v)", left / 1073741824.0);
		}
	}
	return avail;
}

void rmoe_host_peak_rss_reset(void)
{
#if defined(__GLIBC__) && !defined(RMOE_SIMGRID)
	/* Freed heap pages of an earlier pass still count in RSS until trimmed. */
	malloc_trim(0);
#endif
	FILE *f = fopen("/proc/self/clear_refs", "w");
	if (f) {
		fputs("5", f);
		fclose(f);
	}
}

int64_t rmoe_host_peak_rss(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long long kib = -1;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmHWM: %lld kB", &kib) == 1)
			break;
	if (f)
		fclose(f);
	if (kib >= 0)
		return (int64_t)kib * 1024;
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return -1;
	return (int64_t)ru.ru_maxrss * 1024;
}
