/* The simulation's cost models (sim_cost.c), private to codelets/: compiled
 * only into the simulation build (RMOE_SIMGRID, a StarPU with
 * STARPU_SIMGRID), where codelet.h makes them the perfmodels' cost
 * functions and rmoe_codelets_init calls rmoe_sim_cost_init. The real build
 * records history models instead and has none of this. */
#ifndef RMOE_SIM_COST_H
#define RMOE_SIM_COST_H

#include <starpu.h>

/* In microseconds for one task on the arch: analytic, floor + max(flops /
 * rate, bytes / bandwidth), or replayed from recorded history models
 * (RMOE_SIM_HISTORY). rmoe_sim_cost_init: 0 or an RMOE_E* code (a recording
 * asked for and not readable). */
int rmoe_sim_cost_init(void);
double rmoe_sim_time_us(int gpu, double flops, double bytes);
double rmoe_sim_cost_router_fwd(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_router_bwd(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_dispatch_map(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_gather(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_scatter_add(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_unpermute_bwd(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_expert_ffn(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_expert_bwd(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_shared_gate(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_accumulate(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_zero(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_copy_pad(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);
double rmoe_sim_cost_sort_chunks(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl);

#endif /* RMOE_SIM_COST_H */
