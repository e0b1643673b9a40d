/* The tasks of one chunk of a hop, forward and backward (§3.1, §3.3), on
 * temporaries freed when their last task ends. */
#include "rmoe_buffers.h"
#include "rmoe_tasks.h"

int rmoe_chunk_forward(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_routing *rt,
                       starpu_data_handle_t x, starpu_data_handle_t w, const struct rmoe_chunk *c,
                       starpu_data_handle_t acc, int prio, int hop)
{
	const int64_t rows = c->rows;
	starpu_data_handle_t xg = rmoe_act_vector(pass, L, rows * L->H);
	starpu_data_handle_t work = rmoe_act_vector(pass, L, rows * 3 * L->F);
	starpu_data_handle_t out = rmoe_act_vector(pass, L, rows * L->H);
	int rc = rmoe_pass_gather(L, pass, rt, x, c->first, rows, 0, xg, prio, rmoe_task_name("gather", hop));
	if (!rc)
		rc = rmoe_pass_expert_ffn(L, NULL, xg, w, L->e_local, L->F, c->rows_per_expert, rows, work, out, prio,
		                          rmoe_task_name("expert-ffn", hop));
	if (!rc)
		rc = rmoe_pass_scatter_add(L, pass, rt, out, c->first, rows, 1, acc, prio, rmoe_task_name("scatter-add", hop));
	starpu_data_unregister_submit(xg);
	starpu_data_unregister_submit(work);
	starpu_data_unregister_submit(out);
	return rc;
}

int rmoe_chunk_backward(struct rmoe_layer *L, struct rmoe_pass *pass, const struct rmoe_routing *rt,
                        starpu_data_handle_t x, starpu_data_handle_t dy, starpu_data_handle_t w,
                        const struct rmoe_chunk *c, starpu_data_handle_t dx, starpu_data_handle_t dw, int accumulate,
                        int prio, int hop)
{
	const int64_t rows = c->rows;
	starpu_data_handle_t xg = rmoe_act_vector(pass, L, rows * L->H);
	starpu_data_handle_t dyg = rmoe_act_vector(pass, L, rows * L->H);
	starpu_data_handle_t work = rmoe_act_vector(pass, L, rows * 4 * L->F);
	int rc = rmoe_pass_gather(L, pass, rt, x, c->first, rows, 0, xg, prio, rmoe_task_name("gather", hop));
	if (!rc)
		rc = rmoe_pass_gather(L, pass, rt, dy, c->first, rows, 0, dyg, prio, rmoe_task_name("gather-dy", hop));
	if (!rc)
		rc = rmoe_pass_expert_ffn(L, NULL, xg, w, L->e_local, L->F, c->rows_per_expert, rows, work, NULL, prio,
		                          rmoe_task_name("recompute", hop));
	if (!rc)
		rc = rmoe_pass_expert_bwd_pairs(L, pass, rt, xg, dyg, w, c, work, dx, dw, accumulate, prio,
		                                rmoe_task_name("expert-bwd", hop));
	starpu_data_unregister_submit(xg);
	starpu_data_unregister_submit(dyg);
	starpu_data_unregister_submit(work);
	return rc;
}
