/* The status tasks report failures to (rmoe_task_status), the head every
 * task's argument block starts with to find it, and the fault a test can
 * inject into one named task's checks. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_cl_runtime.h"
#include "rmoe_system.h"

static struct rmoe_task_status default_status;

struct rmoe_task_status *rmoe_task_status_default(void)
{
	return &default_status;
}

void rmoe_task_status_reset(struct rmoe_task_status *s)
{
	memset(s, 0, sizeof(*s));
}

int rmoe_task_status_record(struct rmoe_task_status *s, int code, const char *task, const char *message)
{
	if (!s)
		s = &default_status;
	/* The first failure wins; later ones (a task that failed alongside,
	 * on another worker) are printed only. */
	int unclaimed = 0;
	if (__atomic_compare_exchange_n(&s->claimed, &unclaimed, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		snprintf(s->task, sizeof(s->task), "%s", task ? task : "?");
		snprintf(s->message, sizeof(s->message), "%s", message ? message : "");
		__atomic_store_n(&s->code, code ? code : RMOE_ESTARPU, __ATOMIC_RELEASE);
	}
	fprintf(stderr, "relaymoe: task %s failed: %s\n", task ? task : "?", message ? message : "");
	return -1;
}

int rmoe_task_status_check(const struct rmoe_task_status *s)
{
	int code = __atomic_load_n(&s->code, __ATOMIC_ACQUIRE);
	if (!code)
		return 0;
	return rmoe_error(code, "task %s failed: %s", s->task, s->message);
}

/* ---- the head of a task's arguments ----------------------------------------------------- */

void *rmoe_cl_args_with_head(struct rmoe_task_status *status, void *args, size_t argsize)
{
	struct rmoe_cl_head *h = malloc(RMOE_CL_HEAD_BYTES + argsize);
	if (h) {
		h->status = status ? status : &default_status;
		if (argsize)
			memcpy((char *)h + RMOE_CL_HEAD_BYTES, args, argsize);
	}
	free(args);
	return h;
}

struct rmoe_task_status *rmoe_cl_status(void)
{
	struct starpu_task *t = starpu_task_get_current();
	/* Every task with a function carries a head (rmoe_cl_insert). */
	return t && t->cl_arg ? ((struct rmoe_cl_head *)t->cl_arg)->status : &default_status;
}

int rmoe_cl_begin(void *cl_arg)
{
	const struct rmoe_cl_head *h = cl_arg;
	/* A task after a failure of its pass computes nothing: its inputs may
	 * be what the failed task left. */
	return !(h && h->status && __atomic_load_n(&h->status->code, __ATOMIC_ACQUIRE));
}

/* ---- fault injection --------------------------------------------------------------------- */

/* RMOE_FAULT_TASK=name[@rank]: the tasks of that name (with the hop, as
 * traces show it: "expert-ffn h1"), on every rank or on the one whose
 * launcher rank is given, see their first buffer one element short, and
 * fail the real size check. Tests of the error path use it; unset, it costs
 * one string comparison per task. */
static struct {
	pthread_once_t once;
	char name[64];
	int rank; /* -1: every rank */
	int self;
} fault = {PTHREAD_ONCE_INIT, "", -1, -1};

static int launcher_rank(void)
{
	static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *v = getenv(vars[i]);
		if (v && *v)
			return atoi(v);
	}
	return 0;
}

static void fault_read(void)
{
	const char *v = rmoe_env(RMOE_ENV_FAULT_TASK);
	if (!v || !*v)
		return;
	snprintf(fault.name, sizeof(fault.name), "%s", v);
	char *at = strrchr(fault.name, '@');
	if (at) {
		*at = '\0';
		fault.rank = atoi(at + 1);
	}
	fault.self = launcher_rank();
}

int rmoe_cl_fault_injected(void)
{
	pthread_once(&fault.once, fault_read);
	if (!fault.name[0] || (fault.rank >= 0 && fault.rank != fault.self))
		return 0;
	struct starpu_task *t = starpu_task_get_current();
	return t && t->name && strcmp(t->name, fault.name) == 0;
}
