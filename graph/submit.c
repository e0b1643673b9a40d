/* Task insertion for the graphs: the codelets' argument structs are built
 * here, and the "window" that bounds how far ahead a ring may run.
 *
 * Window. StarPU starts any task whose data are ready: a worker idle while
 * hop h waits for its weights would gather the rows of hops h+1, h+2, ...
 * ahead of time, and each early gather keeps a hop's rows alive. That
 * prefetch buys nothing (gathers are cheap) and spends the memory the ring
 * exists to save. So the gathers of each chunk (a whole hop unless chunking
 * is on) wait for the expert task of the chunk before: one chunk's
 * intermediates at a time, §3.3. The expert tasks are kept (destroy = 0) as
 * dependency anchors until the pass ends.
 *
 * Gate. A ring adds each hop's partial (expert routing: the weight gradient;
 * token routing: outputs, dx, dg) into the accumulator arriving from the
 * left; the partial lives until then. That addition becomes the window too:
 * the next hop's gathers, partials and expert task wait for it, as the
 * paper's GPU waits at this synchronisation point (§3.1), so one partial and
 * one hop's rows exist at a time whatever the network does. The accumulator
 * left its neighbour a hop before the next weights (or tokens) did, so the
 * wait rarely costs anything. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_codelets.h"
#include "rmoe_graph.h"

/* Colours of the operations in a trace (ViTE; scripts/trace/ keeps its own
 * palette), one per operation whatever the hop. StarPU 1.3 passes each
 * 0-255 component to Paje where 0-1 is expected, so only components 0 and
 * 0xff show as meant. Matched on the name's start: "gather" covers
 * "gather-dy", "accumulate" "accumulate-dg", "zero" every zeroing. */
static const struct {
	const char *op;
	int colour;
} op_colours[] = {
	{"gather", 0x00ffff},      {"expert-ffn", 0xff0000}, {"scatter-add", 0xffff00},
	{"recompute", 0xff00ff},   {"expert-bwd", 0x0000ff}, {"grad-accumulate", 0x00ff00},
	{"accumulate", 0x00ff00},  {"zero", 0xffffff},
};

static int task_colour(const char *name)
{
	for (size_t i = 0; name && i < sizeof(op_colours) / sizeof(op_colours[0]); i++)
		if (strncmp(name, op_colours[i].op, strlen(op_colours[i].op)) == 0)
			return op_colours[i].colour;
	return 0; /* StarPU's own */
}

int rmoe_insert_failed(const char *what, int ret)
{
	if (ret == -ENODEV)
		return rmoe_error(RMOE_ESTARPU, "no StarPU worker can run the %s codelet", what);
	return rmoe_error(RMOE_ESTARPU, "submitting a %s task failed (%d)", what, ret);
}

int rmoe_clamp_prio(int prio)
{
	int lo = starpu_sched_get_min_priority(), hi = starpu_sched_get_max_priority();
	if (prio < lo)
		return lo;
	if (prio > hi)
		return hi;
	return prio;
}

static int push_anchor(struct rmoe_pass *pass, struct starpu_task *t)
{
	if (pass->nanchors == pass->capanchors) {
		int cap = pass->capanchors ? 2 * pass->capanchors : 16;
		struct starpu_task **a = realloc(pass->anchors, (size_t)cap * sizeof(*a));
		if (!a)
			return rmoe_error(RMOE_ENOMEM, "out of host memory");
		pass->anchors = a;
		pass->capanchors = cap;
	}
	pass->anchors[pass->nanchors++] = t;
	return 0;
}

void rmoe_pass_release(struct rmoe_pass *pass)
{
	for (int i = 0; i < pass->nanchors; i++)
		starpu_task_destroy(pass->anchors[i]);
	free(pass->anchors);
	pass->anchors = NULL;
	pass->nanchors = pass->capanchors = 0;
	pass->window = pass->gate = NULL;
	for (int i = 0; i < pass->nheld; i++)
		starpu_data_unregister(pass->held[i]);
	free(pass->held);
	pass->held = NULL;
	pass->nheld = pass->capheld = 0;
}

int rmoe_pass_hold(struct rmoe_pass *pass, starpu_data_handle_t h)
{
	if (pass->nheld == pass->capheld) {
		int cap = pass->capheld ? 2 * pass->capheld : 8;
		starpu_data_handle_t *a = realloc(pass->held, (size_t)cap * sizeof(*a));
		if (!a) {
			/* Not held: freed when its last user ends, which is also correct. */
			starpu_data_unregister_submit(h);
			return rmoe_error(RMOE_ENOMEM, "out of host memory");
		}
		pass->held = a;
		pass->capheld = cap;
	}
	pass->held[pass->nheld++] = h;
	return 0;
}

enum {
	WAIT_WINDOW = 1, /* wait for the pass's window */
	WAIT_GATE = 2,   /* wait for the pass's gate, and consume it */
	ANCHOR = 4,      /* keep the task (destroy = 0) until the pass ends */
	BE_WINDOW = 8,   /* become the window (implies ANCHOR) */
};

/* Submits a task built by starpu_task_build, with the dependencies and the
 * role that flags give it. */
static int submit_built(struct starpu_task *t, const char *what, struct rmoe_pass *pass, unsigned flags)
{
	if (!t)
		return rmoe_error(RMOE_ESTARPU, "building a %s task failed", what);
	if (!pass)
		flags = 0;
	if (flags & BE_WINDOW)
		flags |= ANCHOR;
	if ((flags & WAIT_WINDOW) && pass->window)
		starpu_task_declare_deps_array(t, 1, &pass->window);
	if ((flags & WAIT_GATE) && pass->gate) {
		starpu_task_declare_deps_array(t, 1, &pass->gate);
		pass->gate = NULL;
	}
	if (flags & ANCHOR) {
		t->destroy = 0;
		int rc = push_anchor(pass, t);
		if (rc) {
			starpu_task_destroy(t);
			return rc;
		}
	}
	int ret = starpu_task_submit(t);
	if (ret) {
		if (flags & ANCHOR)
			pass->nanchors--;
		starpu_task_destroy(t);
		return rmoe_insert_failed(what, ret);
	}
	if (flags & BE_WINDOW)
		pass->window = t;
	return 0;
}

int rmoe_submit_gather(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_routing *rt,
                       starpu_data_handle_t src, int64_t first, int64_t count, int weighted,
                       starpu_data_handle_t rows, int prio, const char *name)
{
	struct rmoe_rows_args *a = malloc(sizeof(*a));
	if (!a)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	*a = (struct rmoe_rows_args){.first = first, .count = count, .hidden = L->H, .topk = L->K,
	                             .weighted = weighted};
	struct starpu_data_descr d[4] = {
		{src, STARPU_R}, {rt->pair_order, STARPU_R}, {rows, STARPU_W}, {rt->topk_w, STARPU_R}};
	struct starpu_task *t = starpu_task_build(&rmoe_cl_gather, STARPU_DATA_MODE_ARRAY, d, weighted ? 4 : 3,
	                                          STARPU_CL_ARGS, a, sizeof(*a), STARPU_PRIORITY,
	                                          rmoe_clamp_prio(prio), STARPU_NAME, name, STARPU_TASK_COLOR,
	                                          task_colour(name), 0);
	return submit_built(t, "gather", pass, WAIT_WINDOW);
}

int rmoe_submit_scatter_add(struct rmoe_layer *L, const struct rmoe_routing *rt,
                            starpu_data_handle_t rows, int64_t first, int64_t count, int weighted,
                            starpu_data_handle_t dst, int prio, const char *name)
{
	struct rmoe_rows_args *a = malloc(sizeof(*a));
	if (!a)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	*a = (struct rmoe_rows_args){.first = first, .count = count, .hidden = L->H, .topk = L->K,
	                             .weighted = weighted};
	/* Contributions of different hops commute (§3.1: in-place accumulation
	 * of partial outputs), unless the user wants bit-reproducible sums. */
	enum starpu_data_access_mode acc = L->cfg.deterministic ? STARPU_RW : STARPU_RW | STARPU_COMMUTE;
	struct starpu_data_descr d[4] = {{rows, STARPU_R},
	                                 {rt->pair_order, STARPU_R},
	                                 {dst, acc},
	                                 {rt->topk_w, STARPU_R}};
	int ret = starpu_task_insert(&rmoe_cl_scatter_add, STARPU_DATA_MODE_ARRAY, d, weighted ? 4 : 3,
	                             STARPU_CL_ARGS, a, sizeof(*a), STARPU_PRIORITY, rmoe_clamp_prio(prio),
	                             STARPU_NAME, name, STARPU_TASK_COLOR, task_colour(name), 0);
	return ret ? rmoe_insert_failed("scatter-add", ret) : 0;
}

static struct rmoe_expert_args *expert_args(int64_t hidden, int64_t ffn, int64_t n_experts,
                                            const int64_t *rows_per_expert, int64_t nrows)
{
	struct rmoe_expert_args *a = malloc(rmoe_expert_args_size(n_experts));
	if (!a)
		return NULL;
	memset(a, 0, sizeof(*a));
	a->hidden = hidden;
	a->ffn = ffn;
	a->n_experts = n_experts;
	a->rows = nrows;
	memcpy(a->rows_per_expert, rows_per_expert, (size_t)n_experts * sizeof(int64_t));
	return a;
}

int rmoe_submit_expert_ffn(struct rmoe_layer *L, struct rmoe_pass *anchor, starpu_data_handle_t rows,
                           starpu_data_handle_t w, int64_t n_experts, int64_t ffn,
                           const int64_t *rows_per_expert, int64_t nrows, starpu_data_handle_t work,
                           starpu_data_handle_t out, int prio, const char *name)
{
	struct rmoe_expert_args *a = expert_args(L->H, ffn, n_experts, rows_per_expert, nrows);
	if (!a)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	size_t sz = rmoe_expert_args_size(n_experts);
	struct starpu_task *t;
	if (out)
		t = starpu_task_build(&rmoe_cl_expert_ffn, STARPU_R, rows, STARPU_R, w, STARPU_W, work, STARPU_W,
		                      out, STARPU_CL_ARGS, a, sz, STARPU_PRIORITY, rmoe_clamp_prio(prio),
		                      STARPU_FLOPS, rmoe_flops_expert_ffn(nrows, L->H, ffn, 1), STARPU_NAME,
		                      name, STARPU_TASK_COLOR, task_colour(name), 0);
	else
		t = starpu_task_build(&rmoe_cl_expert_recompute, STARPU_R, rows, STARPU_R, w, STARPU_W, work,
		                      STARPU_CL_ARGS, a, sz, STARPU_PRIORITY, rmoe_clamp_prio(prio),
		                      STARPU_FLOPS, rmoe_flops_expert_ffn(nrows, L->H, ffn, 0), STARPU_NAME,
		                      name, STARPU_TASK_COLOR, task_colour(name), 0);
	return submit_built(t, "expert-ffn", anchor, BE_WINDOW);
}

int rmoe_submit_expert_bwd_pairs(struct rmoe_layer *L, struct rmoe_pass *anchor,
                                 const struct rmoe_routing *rt, starpu_data_handle_t xrows,
                                 starpu_data_handle_t dyrows, starpu_data_handle_t w,
                                 const struct rmoe_chunk *c, starpu_data_handle_t work,
                                 starpu_data_handle_t dx, starpu_data_handle_t dw, int accumulate,
                                 int prio, const char *name)
{
	enum starpu_data_access_mode acc = L->cfg.deterministic ? STARPU_RW : STARPU_RW | STARPU_COMMUTE;
	struct rmoe_expert_args *a = expert_args(L->H, L->F, L->e_local, c->rows_per_expert, c->rows);
	if (!a)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	a->mode = RMOE_BWD_PAIR_WEIGHTED;
	a->accumulate = accumulate;
	a->first = c->first;
	a->topk = L->K;
	struct starpu_data_descr d[9] = {
		{xrows, STARPU_RW},         {dyrows, STARPU_R},
		{w, STARPU_R},              {rt->pair_order, STARPU_R},
		{rt->topk_w, STARPU_R},     {work, STARPU_RW},
		{dx, acc},                  {rt->dg, STARPU_RW | STARPU_COMMUTE},
		{dw, accumulate ? STARPU_RW : STARPU_W},
	};
	struct starpu_task *t = starpu_task_build(
		&rmoe_cl_expert_bwd, STARPU_DATA_MODE_ARRAY, d, 9, STARPU_CL_ARGS, a,
		rmoe_expert_args_size(L->e_local), STARPU_PRIORITY, rmoe_clamp_prio(prio), STARPU_FLOPS,
		rmoe_flops_expert_bwd(c->rows, L->H, L->F, RMOE_BWD_PAIR_WEIGHTED), STARPU_NAME, name,
		STARPU_TASK_COLOR, task_colour(name), 0);
	return submit_built(t, "expert-bwd", anchor, WAIT_GATE | BE_WINDOW);
}

int rmoe_submit_expert_bwd_preweighted(struct rmoe_layer *L, starpu_data_handle_t xrows,
                                       starpu_data_handle_t doutrows, starpu_data_handle_t w,
                                       int64_t n_experts, int64_t ffn,
                                       const int64_t *rows_per_expert, int64_t nrows,
                                       starpu_data_handle_t work, starpu_data_handle_t dxrows,
                                       starpu_data_handle_t dw, int prio, const char *name)
{
	struct rmoe_expert_args *a = expert_args(L->H, ffn, n_experts, rows_per_expert, nrows);
	if (!a)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	a->mode = RMOE_BWD_PREWEIGHTED;
	struct starpu_data_descr d[6] = {
		{xrows, STARPU_R}, {doutrows, STARPU_R}, {w, STARPU_R},
		{work, STARPU_RW}, {dxrows, STARPU_W},   {dw, STARPU_W},
	};
	int ret = starpu_task_insert(&rmoe_cl_expert_bwd, STARPU_DATA_MODE_ARRAY, d, 6, STARPU_CL_ARGS, a,
	                             rmoe_expert_args_size(n_experts), STARPU_PRIORITY,
	                             rmoe_clamp_prio(prio), STARPU_FLOPS,
	                             rmoe_flops_expert_bwd(nrows, L->H, ffn, RMOE_BWD_PREWEIGHTED),
	                             STARPU_NAME, name, STARPU_TASK_COLOR, task_colour(name), 0);
	return ret ? rmoe_insert_failed("expert-bwd", ret) : 0;
}

int rmoe_submit_accumulate(struct rmoe_pass *gate_pass, starpu_data_handle_t src, starpu_data_handle_t dst,
                           int64_t count, int prio, const char *name)
{
	struct rmoe_accumulate_args *a = malloc(sizeof(*a));
	if (!a)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	a->count = count;
	struct starpu_task *t = starpu_task_build(&rmoe_cl_accumulate, STARPU_R, src, STARPU_RW, dst,
	                                          STARPU_CL_ARGS, a, sizeof(*a), STARPU_PRIORITY,
	                                          rmoe_clamp_prio(prio), STARPU_NAME, name, STARPU_TASK_COLOR,
	                                          task_colour(name), 0);
	int rc = submit_built(t, "grad-accumulate", gate_pass, BE_WINDOW);
	if (!rc && gate_pass)
		gate_pass->gate = t;
	return rc;
}

int rmoe_submit_zero(struct rmoe_pass *pass, starpu_data_handle_t dst, int64_t count, int prio,
                     const char *name)
{
	struct rmoe_accumulate_args *a = malloc(sizeof(*a));
	if (!a)
		return rmoe_error(RMOE_ENOMEM, "out of host memory");
	a->count = count;
	struct starpu_task *t = starpu_task_build(&rmoe_cl_zero, STARPU_W, dst, STARPU_CL_ARGS, a, sizeof(*a),
	                                          STARPU_PRIORITY, rmoe_clamp_prio(prio), STARPU_NAME, name,
	                                          STARPU_TASK_COLOR, task_colour(name), 0);
	return submit_built(t, "zero", pass, WAIT_WINDOW);
}

/* ---- task names ------------------------------------------------------------- */

/* StarPU keeps the name pointer until the task is gone, so names with a hop
 * number are interned for the life of the process (ops x hops: bounded). */
struct interned {
	struct interned *next;
	char s[];
};
static struct interned *interned_names;
static pthread_mutex_t interned_lock = PTHREAD_MUTEX_INITIALIZER;

const char *rmoe_task_name(const char *op, int hop)
{
	char buf[64];
	if (hop >= 0)
		snprintf(buf, sizeof(buf), "%s h%d", op, hop);
	else
		snprintf(buf, sizeof(buf), "%s", op);
	pthread_mutex_lock(&interned_lock);
	struct interned *i;
	for (i = interned_names; i; i = i->next)
		if (strcmp(i->s, buf) == 0)
			break;
	if (!i) {
		i = malloc(sizeof(*i) + strlen(buf) + 1);
		if (i) {
			strcpy(i->s, buf);
			i->next = interned_names;
			interned_names = i;
		}
	}
	pthread_mutex_unlock(&interned_lock);
	return i ? i->s : op;
}
