/* system/: what reads or changes the machine this process runs on, apart
 * from the pure planner (scheduler/): the host's memory and the process's
 * (host.c: /proc, cgroups, rlimits), files (files.c: folders, a cluster
 * description read from disk), the environment's part of a configuration
 * (environment.c: every RMOE_* variable, and rmoe_layer_config_init,
 * declared in relaymoe.h), and this
 * machine as hwloc sees it (local_hw.c). No StarPU and no MPI. */
#ifndef RMOE_SYSTEM_H
#define RMOE_SYSTEM_H

#include <stddef.h>
#include <stdint.h>

#include "relaymoe/relaymoe.h"
#include "rmoe_plan.h"
#include "rmoe_scheduler.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the environment ------------------------------------------------------ */

/* Every RMOE_* variable read anywhere (environment.c holds their names and
 * what each does; docs/tuning.md lists them). */
enum rmoe_env_knob {
	RMOE_ENV_WAIT_TIMEOUT,
	RMOE_ENV_HOST_CACHE,
	RMOE_ENV_DEVICE_CACHE,
	RMOE_ENV_HEAP_SAMPLER_US,
	RMOE_ENV_FLOW_CREDITS,
	RMOE_ENV_SCRATCH_ON_CPU,
	RMOE_ENV_FAULT_TASK,
	RMOE_ENV_TEST_EXPERT_DELAY_US,
	RMOE_ENV_SIM_SEED,
	RMOE_ENV_SIM_JITTER,
	RMOE_ENV_SIM_HISTORY,
	RMOE_ENV_SIM_HISTORY_HOST,
	RMOE_ENV_TRAIN_PLOT,
	RMOE_ENV_CUDA_GEMM,
	RMOE_ENV_TASK_LOG,
	RMOE_ENV_COUNT
};
/* The variable's value (NULL: unset), its name, and what it does. */
const char *rmoe_env(enum rmoe_env_knob k);
const char *rmoe_env_name(enum rmoe_env_knob k);
const char *rmoe_env_what(enum rmoe_env_knob k);

/* ---- files -------------------------------------------------------------- */

/* mkdir -p: 0, or the errno of the part that failed (ENOTDIR: a file is
 * there). */
int rmoe_mkdir_p(const char *dir);

/* Reads and parses a cluster description (rmoe_cluster_parse); errors are
 * prefixed with its path (RMOE_EIO when it cannot be read or is larger than
 * RMOE_CLUSTER_MAX_FILE_BYTES). */
int rmoe_cluster_load(const char *path, struct rmoe_cluster *out);

/* ---- host probes (Linux) ------------------------------------------------ */

/* Bytes this rank can hold in host memory: the node's memory (or its
 * cgroup's limit, as a batch system sets it for a job) shared by
 * ranks_on_node ranks, and what the address-space limit (ulimit -v) leaves;
 * -1 when none is known. why receives a phrase saying which bound holds. */
double rmoe_host_memory_available(int ranks_on_node, char *why, size_t len);

/* Process peak RSS since the last reset (VmHWM, reset through
 * /proc/self/clear_refs on Linux >= 4.0, getrusage otherwise); -1 when
 * unknown. */
int64_t rmoe_host_peak_rss(void);
/* The process's address space now (VmSize, /proc/self/statm), bytes. */
int64_t rmoe_host_vm_bytes(void);
void rmoe_host_peak_rss_reset(void);

/* ---- this machine (hwloc) ---------------------------------------------- */

/* What hwloc sees on this machine: 0, or RMOE_ENOTSUP when hwloc cannot
 * load its topology. */
int rmoe_local_hw_probe(struct rmoe_local_hw *hw);

/* This rank's report: its host name as MPI names it (given by the caller:
 * MPI_Get_processor_name) and what hwloc sees on this machine, also
 * returned in hw (no GPU and NVLink unknown when hwloc fails: the ring is
 * still planned from the host names). */
void rmoe_rank_info_local(const char *host, struct rmoe_rank_info *me, struct rmoe_local_hw *hw);

#ifdef __cplusplus
}
#endif

#endif /* RMOE_SYSTEM_H */
