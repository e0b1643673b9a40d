/* The one way a task of the library is inserted: its priority clamped into
 * the policy's range, its name, its trace colour, the task it waits for and
 * whether it is kept. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_cl_runtime.h"

/* Colours of the operations in a trace, one per operation whatever the hop.
 * StarPU 1.3 passes each 0-255 component to Paje where 0-1 is expected, so
 * only components 0 and 0xff show as meant. Matched on the name's start:
 * "gather" covers "gather-dy", "accumulate" "accumulate-dg", "zero" every
 * zeroing. */
static const struct {
	const char *op;
	int colour;
} op_colours[] = {
	{"gather", 0x00ffff},      {"expert-ffn", 0xff0000}, {"scatter-add", 0xffff00},
	{"recompute", 0xff00ff},   {"expert-bwd", 0x0000ff}, {"grad-accumulate", 0x00ff00},
	{"accumulate", 0x00ff00},  {"zero", 0xffffff},
};

static int colour(const char *name)
{
	for (size_t i = 0; name && i < sizeof(op_colours) / sizeof(op_colours[0]); i++)
		if (strncmp(name, op_colours[i].op, strlen(op_colours[i].op)) == 0)
			return op_colours[i].colour;
	return 0; /* StarPU's own */
}

static int clamp_prio(int prio)
{
	int lo = starpu_sched_get_min_priority(), hi = starpu_sched_get_max_priority();
	return prio < lo ? lo : prio > hi ? hi : prio;
}

int rmoe_cl_insert(const struct rmoe_task_opts *o, struct starpu_codelet *cl, struct starpu_data_descr *d, int nd,
                   void *args, size_t argsize, double flops)
{
	if (!args && argsize > 0)
		return rmoe_error(RMOE_ENOMEM, "out of host memory for a %s task", cl->name);
	/* A task that runs a function gets its arguments behind the head that
	 * leads its failures to its pass's status (status.c); an ordering
	 * task runs nothing. */
	if (cl->where != STARPU_NOWHERE) {
		if (!(args = rmoe_cl_args_with_head(o->status, args, argsize)))
			return rmoe_error(RMOE_ENOMEM, "out of host memory for a %s task", cl->name);
		argsize += RMOE_CL_HEAD_BYTES;
	}
	struct starpu_task *t =
		starpu_task_build(cl, STARPU_DATA_MODE_ARRAY, d, nd, STARPU_CL_ARGS, args, argsize, STARPU_PRIORITY,
		                  clamp_prio(o->prio), STARPU_NAME, o->name, STARPU_TASK_COLOR, colour(o->name), 0);
	if (!t) {
		free(args);
		return rmoe_error(RMOE_ESTARPU, "building a %s task failed", cl->name);
	}
	if (flops > 0)
		t->flops = flops;
	if (o->log) {
		t->callback_func = rmoe_task_log_line;
		t->callback_arg = o->log;
	}
	if (o->after)
		starpu_task_declare_deps_array(t, 1, (struct starpu_task **)&o->after);
	if (o->kept)
		t->destroy = 0;
	rmoe_bookkeeping_count_task(nd, argsize);
	int ret = starpu_task_submit(t);
	if (ret) {
		/* StarPU 1.3 refuses to destroy a detached task that would
		 * destroy itself (task.c's assertion); it never ran, so it is
		 * ours to free, its arguments with it. */
		t->destroy = 0;
		starpu_task_destroy(t);
		if (ret == -ENODEV)
			return rmoe_error(RMOE_ESTARPU, "no StarPU worker can run the %s codelet", cl->name);
		return rmoe_error(RMOE_ESTARPU, "submitting a %s task failed (%d)", cl->name, ret);
	}
	if (o->kept)
		*o->kept = t;
	return 0;
}

void *rmoe_cl_args_dup(const void *args, size_t size)
{
	void *a = malloc(size);
	if (a)
		memcpy(a, args, size);
	return a;
}
