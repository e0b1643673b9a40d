/* Every RMOE_* environment variable the library and its programs read, in
 * one table, each with what it does (docs/tuning.md lists them all, and
 * docs_check keeps the two together); and what the environment sets in a
 * layer configuration: its defaults (scheduler/config.c), then
 * RMOE_WAIT_TIMEOUT. A reader parses its own variable, naming it in its
 * errors. */
#include <math.h>
#include <stdlib.h>

#include "rmoe_system.h"

static const struct {
	const char *name, *what;
} knobs[RMOE_ENV_COUNT] = {
	[RMOE_ENV_WAIT_TIMEOUT] = {"RMOE_WAIT_TIMEOUT", "seconds a collective wait lasts before RMOE_EPEER (0: forever)"},
	[RMOE_ENV_HOST_CACHE] = {"RMOE_HOST_CACHE", "StarPU's main-memory buffers through a cache of freed blocks"},
	[RMOE_ENV_DEVICE_CACHE] = {"RMOE_DEVICE_CACHE", "off: StarPU keeps no freed device buffer for reuse"},
	[RMOE_ENV_HEAP_SAMPLER_US] = {"RMOE_HEAP_SAMPLER_US", "period of the heap sampler thread, microseconds"},
	[RMOE_ENV_FLOW_CREDITS] = {"RMOE_FLOW_CREDITS", "off: the relays' receive slots without credits (a control)"},
	[RMOE_ENV_SCRATCH_ON_CPU] = {"RMOE_SCRATCH_ON_CPU", "1: device scratch declared without CUDA workers too"},
	[RMOE_ENV_FAULT_TASK] = {"RMOE_FAULT_TASK", "a task whose checks fail on purpose (error-path tests)"},
	[RMOE_ENV_TEST_EXPERT_DELAY_US] = {"RMOE_TEST_EXPERT_DELAY_US", "each CPU expert task sleeps this long first"},
	[RMOE_ENV_SIM_SEED] = {"RMOE_SIM_SEED", "the simulation's synthetic routing: its seed"},
	[RMOE_ENV_SIM_JITTER] = {"RMOE_SIM_JITTER", "the simulation's synthetic routing: its spread"},
	[RMOE_ENV_SIM_HISTORY] = {"RMOE_SIM_HISTORY", "the simulation's task times from a recorded FxT history"},
	[RMOE_ENV_SIM_HISTORY_HOST] = {"RMOE_SIM_HISTORY_HOST", "the host name that history was recorded under"},
	[RMOE_ENV_TRAIN_PLOT] = {"RMOE_TRAIN_PLOT", "relaymoe train: the script that plots its CSV"},
	[RMOE_ENV_CUDA_GEMM] = {"RMOE_CUDA_GEMM", "the CUDA expert GEMMs' way: grouped, strided or loop"},
	[RMOE_ENV_TASK_LOG] = {"RMOE_TASK_LOG", "PREFIX: every task's times, a CSV per rank (PREFIX.RANK.csv)"},
};

const char *rmoe_env(enum rmoe_env_knob k)
{
	return (unsigned)k < RMOE_ENV_COUNT ? getenv(knobs[k].name) : NULL;
}

const char *rmoe_env_name(enum rmoe_env_knob k)
{
	return (unsigned)k < RMOE_ENV_COUNT ? knobs[k].name : "RMOE_?";
}

const char *rmoe_env_what(enum rmoe_env_knob k)
{
	return (unsigned)k < RMOE_ENV_COUNT ? knobs[k].what : "";
}

void rmoe_layer_config_init(struct rmoe_layer_config *cfg)
{
	rmoe_layer_config_defaults(cfg);
	/* Launchers that do not end the job when a rank dies leave the others
	 * waiting forever; the environment arms the timeout without a rebuild.
	 * A malformed value becomes -1, which rmoe_config_check refuses. */
	const char *timeout = rmoe_env(RMOE_ENV_WAIT_TIMEOUT);
	if (timeout && *timeout) {
		char *end;
		double v = strtod(timeout, &end);
		cfg->wait_timeout = (*end == '\0' && isfinite(v) && v >= 0) ? v : -1;
	}
}
