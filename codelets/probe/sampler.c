/* The sampler thread: samples the memory probe (probe.c, which samples the
 * heap probe too) while a pass is measured, so that memory held while no
 * codelet runs is seen. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rmoe_cl_probe.h"
#include "rmoe_system.h"

/* One thread, started by the first rmoe_sampler_start and joined by the
 * matching last stop (counted, for passes of two layers in one process).
 * Codelets sample on entry, but a pass also holds memory while no codelet
 * runs: the all-to-all's exchange buffers, StarPU-MPI's early-data copies,
 * Open MPI's unexpected messages. Every 0.5 ms is short beside a hop or an
 * exchange of the sizes measured (milliseconds) and costs one mallinfo2
 * (a walk of the arenas' free lists) and one read of StarPU's counters;
 * while nothing moves, less often (sampler_main). */
static struct {
	pthread_mutex_t lock;
	pthread_t thread;
	int users;
	atomic_int stop;
	long period_us; /* RMOE_HEAP_SAMPLER_US: 0 off; -1 not read yet */
} sampler = {.lock = PTHREAD_MUTEX_INITIALIZER, .period_us = -1};

#ifndef STARPU_SIMGRID
/* RMOE_HEAP_SAMPLER_US: the sampler's period in microseconds (default
 * 500), "off" or 0 for none (the codelets' samples on entry only). Under
 * the lock. */
static long sampler_period(void)
{
	if (sampler.period_us >= 0)
		return sampler.period_us;
	long us = 500;
	const char *env = rmoe_env(RMOE_ENV_HEAP_SAMPLER_US);
	if (env && *env) {
		char *end;
		const long v = strtol(env, &end, 10);
		if (!strcmp(env, "off"))
			us = 0;
		else if (!*end && v >= 0 && v <= 1000000)
			us = v;
		else
			fprintf(stderr, "relaymoe: RMOE_HEAP_SAMPLER_US='%s': expected off or microseconds "
			        "(0 to 1000000); sampling every %ld us\n", env, us);
	}
	sampler.period_us = us;
	return us;
}
#endif

#ifndef STARPU_SIMGRID
/* Each sample wakes a thread on cores that the workers and their BLAS
 * threads keep busy: it preempts one of them, and a multithreaded GEMM
 * waits for its slowest thread. While the level stays where it was (a
 * long GEMM allocates nothing) the period doubles, up to SAMPLER_BACKOFF
 * times the set one; the first change brings it back. A level that moves
 * after a quiet stretch is seen at most that much later, a short time
 * beside the GEMM that kept it still. */
enum { SAMPLER_BACKOFF = 8 };

static void *sampler_main(void *arg)
{
	(void)arg;
	const long base = sampler.period_us;
	long us = base;
	int64_t last = -1;
	while (!atomic_load_explicit(&sampler.stop, memory_order_relaxed)) {
		const struct timespec period = {us / 1000000, us % 1000000 * 1000};
		clock_nanosleep(CLOCK_MONOTONIC, 0, &period, NULL);
		const int64_t level = rmoe_probe_sample(1);
		us = level != last ? base : us < SAMPLER_BACKOFF * base ? 2 * us : us;
		last = level;
	}
	return NULL;
}
#endif

int rmoe_sampler_start(void)
{
#ifdef STARPU_SIMGRID
	/* No task runs and SimGrid owns the threads that call StarPU: nothing
	 * to sample. */
	return -1;
#else
	int rc = 0;
	pthread_mutex_lock(&sampler.lock);
	if (sampler_period() == 0) {
		pthread_mutex_unlock(&sampler.lock);
		return -1;
	}
	if (sampler.users == 0) {
		pthread_attr_t attr;
		pthread_attr_init(&attr);
		/* It calls mallinfo2 and StarPU's counters: a small stack (a
		 * mapping, outside the heap figure) is plenty. */
		pthread_attr_setstacksize(&attr, 256 * 1024);
		atomic_store(&sampler.stop, 0);
		rc = pthread_create(&sampler.thread, &attr, sampler_main, NULL) ? -1 : 0;
		pthread_attr_destroy(&attr);
	}
	if (rc == 0)
		sampler.users++;
	pthread_mutex_unlock(&sampler.lock);
	return rc;
#endif
}

void rmoe_sampler_stop(void)
{
	pthread_mutex_lock(&sampler.lock);
	if (sampler.users > 0 && --sampler.users == 0) {
		atomic_store(&sampler.stop, 1);
		pthread_join(sampler.thread, NULL);
	}
	pthread_mutex_unlock(&sampler.lock);
}
