/* What relaymoe run measured of each dispatcher (cmd_run.c), and its
 * report (run_report.c): the table, the ratios against the ring, the model
 * against the measured peaks, --check, and the files --dump, --csv and
 * --routing ask for. */
#ifndef RMOE_RUN_REPORT_H
#define RMOE_RUN_REPORT_H

#include <stdint.h>

#include "problem.h"
#include "relaymoe/relaymoe.h"
#include "results.h"
#include "rmoe_config.h"

/* Simulated (StarPU-SimGrid): no output exists and no task samples memory,
 * so the peaks are the memory model's and nothing is compared. */
#ifdef RMOE_SIMGRID
#define RMOE_SIMULATED 1
#else
#define RMOE_SIMULATED 0
#endif

/* One dispatcher's figures, each the largest over the ranks. */
struct rmoe_run_outcome {
	enum rmoe_dispatch d;
	double fwd_ms, bwd_ms;          /* medians, max over ranks */
	double peak_fwd, peak_bwd;      /* bytes, max over ranks */
	double resident, rss, sent;     /* bytes, max over ranks */
	double sent_fwd, sent_bwd;      /* of sent, each pass's, max over ranks (a bound's wire and staging terms) */
	double largest_temp;
	double model_fwd, model_bwd;    /* the memory model's peaks for the routing seen */
	double leave_fwd, leave_bwd;    /* of them, a2a's rows that may leave first (the model's leaving_*) */
	double skew;                    /* busiest hop (rings, a2a) or rank (a2a-megatron) over even */
	int64_t chunk_rows;
	int stripes;                    /* the most a ring hop goes in (rmoe_layer_stripes) */
	double device_fwd, device_bwd;  /* peak on the device (a GPU), bytes, max over ranks; 0: none */
	double heap_fwd, heap_bwd;      /* the heap figure (peak_heap_*), bytes, max over ranks */
	double runtime_fwd, runtime_bwd; /* the runtime's structures of a pass's graph (runtime_*_bytes),
	                                    bytes, max over ranks: the model's term for the heap figure */
	double fb_med, fb_min, fb_max;  /* forward+backward per repetition: median and range, ms */
	double ratio_med, ratio_min, ratio_max; /* forward+backward over the first dispatcher's, per repetition */
};

/* What a run ran on (this rank's context), for the record of every row. */
struct rmoe_run_info {
	const char *sched, *starpu;
	int cpu_workers, cuda_workers;
};

/* A finished run, and what its report is asked for. */
struct rmoe_run_report {
	const struct rmoe_layer_config *cfg;
	const struct rmoe_problem *prob;
	const struct rmoe_run_outcome *out; /* [ndisp], the ratios against out[0] */
	const struct rmoe_results *res;     /* [ndisp] */
	int ndisp;
	struct rmoe_run_info info;
	int check;                          /* --check */
	const char *io;                     /* --io: host | device */
	const char *dump, *csv, *routing;   /* --dump, --csv, --routing; NULL: not asked */
};

/* Prints the report on rank 0, checks and writes what it is asked for
 * (collective); the exit code: 0, or 1 when a check fails or a file
 * cannot be written. */
int rmoe_run_report(const struct rmoe_run_report *rep);

#endif
