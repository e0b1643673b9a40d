/* The task log (RMOE_TASK_LOG): a CSV line for every task of the library
 * as it ends, from StarPU's profiling of the task: when it was submitted,
 * started and ended on which worker, in StarPU's clock (simulated
 * microseconds in the simulation, where FxT traces are not available).
 * What it answers: where a rank's worker sat idle, and between which tasks
 * (bench/sim/task_gaps.py). The callback runs on the workers, so lines go
 * out under the log's lock; one file per rank, opened by the context. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_cl_runtime.h"

struct rmoe_task_log {
	FILE *f;
	pthread_mutex_t lock;
	int rank;
	int failed;   /* a line could not be written: reported at close */
};

int rmoe_task_log_open(const char *prefix, int rank, struct rmoe_task_log **out)
{
	*out = NULL;
	if (!prefix || !*prefix)
		return rmoe_error(RMOE_EINVAL, "task log: expected a path prefix");
	struct rmoe_task_log *l = calloc(1, sizeof(*l));
	if (!l)
		return rmoe_error(RMOE_ENOMEM, "task log: out of host memory");
	char path[4096];
	if (snprintf(path, sizeof(path), "%s.%d.csv", prefix, rank) >= (int)sizeof(path)) {
		free(l);
		return rmoe_error(RMOE_EINVAL, "task log: prefix '%s' is too long", prefix);
	}
	if (!(l->f = fopen(path, "w"))) {
		int e = errno;
		free(l);
		return rmoe_error(RMOE_EIO, "task log: cannot write %s: %s", path, strerror(e));
	}
	pthread_mutex_init(&l->lock, NULL);
	l->rank = rank;
	fprintf(l->f, "rank,task,worker,submit_us,start_us,end_us\n");
	/* Without it StarPU records no times for a task. */
	starpu_profiling_status_set(STARPU_PROFILING_ENABLE);
	*out = l;
	return 0;
}

int rmoe_task_log_close(struct rmoe_task_log *l)
{
	if (!l)
		return 0;
	int failed = l->failed;
	if (fclose(l->f) != 0)
		failed = 1;
	int rc = failed ? rmoe_error(RMOE_EIO, "task log of rank %d: a write failed", l->rank) : 0;
	pthread_mutex_destroy(&l->lock);
	free(l);
	return rc;
}

/* The task's callback (rmoe_cl_insert sets it where a log is given). */
void rmoe_task_log_line(void *arg)
{
	struct rmoe_task_log *l = arg;
	struct starpu_task *t = starpu_task_get_current();
	struct starpu_profiling_task_info *p = t ? t->profiling_info : NULL;
	if (!l || !p)
		return;
	pthread_mutex_lock(&l->lock);
	if (fprintf(l->f, "%d,%s,%d,%.3f,%.3f,%.3f\n", l->rank, t->name ? t->name : "", p->workerid,
	            starpu_timing_timespec_to_us(&p->submit_time), starpu_timing_timespec_to_us(&p->start_time),
	            starpu_timing_timespec_to_us(&p->end_time)) < 0)
		l->failed = 1;
	pthread_mutex_unlock(&l->lock);
}
