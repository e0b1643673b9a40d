/* relaymoe run's report (run_report.h): what the dispatchers measured,
 * side by side and against each other; the reference check; and the files
 * asked for. Every figure was computed and agreed over the ranks before
 * (cmd_run.c); rank 0 prints. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "messages.h"
#include "rmoe_dispatchers.h"
#include "rmoe_system.h"
#include "run_report.h"

/* --check against the double-precision reference: fp32 rounding over the
 * layer's sums; bf16 storage (8 significant bits) of the intermediates and
 * of the relayed gradients. */
#define CHECK_TOLERANCE_F32 1e-5
#define CHECK_TOLERANCE_BF16 1e-2

static const double MiB = 1024.0 * 1024.0;

/* The headline memory metric, fixed before measuring (docs/memory.md): the
 * total peak of a pass, the larger of StarPU's figure and the heap figure,
 * the larger pass. Simulated runs have no heap figure: StarPU's (the
 * model's) alone. */
static double total_peak(const struct rmoe_run_outcome *o)
{
	return fmax(fmax(o->peak_fwd, o->peak_bwd), fmax(o->heap_fwd, o->heap_bwd));
}

/* One row of the table; with a device, its peak (fwd/bwd) at the end. */
static void print_outcome(const struct rmoe_run_outcome *o, int device)
{
	double peak = total_peak(o);
	char dev[48] = "";
	if (device)
		snprintf(dev, sizeof(dev), " %9.1f %9.1f", o->device_fwd / MiB, o->device_bwd / MiB);
	rmoe_app_say("%-12s %9.1f %9.1f %11.1f %11.1f %9.1f %9.1f %10.1f %11.1f %9.1f %9.1f%s\n",
	             rmoe_dispatch_name(o->d), o->fwd_ms, o->bwd_ms, o->peak_fwd / MiB, o->peak_bwd / MiB,
	             o->heap_fwd / MiB, o->heap_bwd / MiB, peak / MiB, (peak - o->resident) / MiB, o->rss / MiB,
	             o->sent / MiB, dev);
}

/* What the device columns count (codelets/probe/probe.c): kept, StarPU's cache
 * of freed device buffers included; off, the bytes the data held. */
static const char *device_cache_mode(void)
{
	const char *env = rmoe_env(RMOE_ENV_DEVICE_CACHE);
	return env && !strcmp(env, "off") ? "off" : "kept";
}

/* --csv: one row per dispatcher, appended, the header first in a new
 * file. */
static int write_csv(const struct rmoe_run_report *rep)
{
	const char *path = rep->csv, *io = rep->io;
	const struct rmoe_layer_config *cfg = rep->cfg;
	const struct rmoe_run_outcome *o = rep->out;
	const struct rmoe_run_info *run_info = &rep->info;
	const int nranks = rep->prob->nranks, n = rep->ndisp;
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (rank != 0)
		return 0;
	FILE *f = fopen(path, "a");
	if (!f) {
		rmoe_app_error("--csv %s: cannot open for appending", path);
		return RMOE_EIO;
	}
	if (ftell(f) == 0)
		fprintf(f, "dispatch,ranks,hidden,ffn,experts,topk,tokens,chunk_rows,fwd_ms,bwd_ms,"
		           "peak_fwd_bytes,peak_bwd_bytes,resident_bytes,peak_rss_bytes,sent_bytes,"
		           "largest_temp_bytes,skew,model_peak_fwd_bytes,model_peak_bwd_bytes,dtype,partitions,"
		           "peak_device_fwd_bytes,peak_device_bwd_bytes,sched,cpu_workers,cuda_workers,starpu,io,"
		           "fwd_bwd_min_ms,fwd_bwd_max_ms,time_vs_first_median,time_vs_first_min,time_vs_first_max,"
		           "fwd_bwd_median_ms,heap_fwd_bytes,heap_bwd_bytes,device_cache,"
		           "model_leaving_fwd_bytes,model_leaving_bwd_bytes,sent_fwd_bytes,sent_bwd_bytes,"
		           "runtime_fwd_bytes,runtime_bwd_bytes\n");
	for (int i = 0; i < n; i++)
		fprintf(f, "%s,%d,%lld,%lld,%lld,%lld,%lld,%lld,%.3f,%.3f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.4f,"
		           "%.0f,%.0f,%s,%lld,%.0f,%.0f,%s,%d,%d,%s,%s,%.3f,%.3f,%.4f,%.4f,%.4f,%.3f,%.0f,%.0f,%s,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f\n",
		        rmoe_dispatch_name(o[i].d), nranks, (long long)cfg->hidden, (long long)cfg->ffn,
		        (long long)cfg->experts, (long long)cfg->topk, (long long)cfg->tokens,
		        (long long)o[i].chunk_rows, o[i].fwd_ms, o[i].bwd_ms, o[i].peak_fwd, o[i].peak_bwd,
		        o[i].resident, o[i].rss, o[i].sent, o[i].largest_temp, o[i].skew, o[i].model_fwd,
		        o[i].model_bwd, cfg->dtype == RMOE_DTYPE_BF16 ? "bf16" : "f32",
		        (long long)(cfg->partitions > 1 && !rmoe_dispatch_alltoall(o[i].d) ? cfg->partitions : 1),
		        o[i].device_fwd, o[i].device_bwd, run_info->sched, run_info->cpu_workers, run_info->cuda_workers,
		        run_info->starpu, io, o[i].fb_min, o[i].fb_max, o[i].ratio_med, o[i].ratio_min, o[i].ratio_max,
		        o[i].fb_med, o[i].heap_fwd, o[i].heap_bwd, device_cache_mode(), o[i].leave_fwd, o[i].leave_bwd,
		        o[i].sent_fwd, o[i].sent_bwd, o[i].runtime_fwd, o[i].runtime_bwd);
	return fclose(f) == 0 ? 0 : RMOE_EIO;
}
/* --routing: the pairs of each rank's tokens routed to each expert, as the
 * expert GEMMs see them (rank r's rows of expert e form one GEMM per
 * matrix): "rank,expert,rows", one line per rank and expert. The routing
 * is that of the run's last pass; every dispatcher routes alike. Written to
 * a temporary name and renamed: no partial file. */
static int write_routing(const char *path, const struct rmoe_problem *p, const int32_t *topk_idx)
{
	const int64_t E = p->cfg.experts, P = p->tokens * p->cfg.topk;
	int64_t *mine = calloc((size_t)E, sizeof(int64_t));
	int64_t *all = p->rank == 0 ? calloc((size_t)(E * p->nranks), sizeof(int64_t)) : NULL;
	int rc = mine && (p->rank != 0 || all) ? 0 : RMOE_ENOMEM;
	for (int64_t i = 0; i < P && !rc; i++)
		mine[topk_idx[i]]++;
	if (rmoe_app_agree(rc)) {
		free(mine);
		free(all);
		rmoe_app_error("--routing %s: out of memory", path);
		return RMOE_ENOMEM;
	}
	MPI_Gather(mine, (int)E, MPI_INT64_T, all, (int)E, MPI_INT64_T, 0, MPI_COMM_WORLD);
	if (p->rank == 0) {
		char tmp[4096];
		snprintf(tmp, sizeof(tmp), "%s.tmp%ld", path, (long)getpid());
		FILE *f = fopen(tmp, "w");
		rc = f ? 0 : RMOE_EIO;
		if (f) {
			fprintf(f, "rank,expert,rows\n");
			for (int r = 0; r < p->nranks; r++)
				for (int64_t e = 0; e < E; e++)
					fprintf(f, "%d,%lld,%lld\n", r, (long long)e, (long long)all[r * E + e]);
			rc = fclose(f) == 0 && rename(tmp, path) == 0 ? 0 : RMOE_EIO;
			if (rc)
				remove(tmp);
		}
		if (rc)
			rmoe_app_error("--routing %s: cannot write it", path);
	}
	free(mine);
	free(all);
	return rc;
}

/* The comparison printed after the table: each all-to-all baseline over
 * each ring mode, the model against the measured peaks, the dispatchers
 * against each other. */
static void print_comparisons(const struct rmoe_run_outcome *out, const struct rmoe_results *res, int ndisp,
                              const struct rmoe_problem *prob)
{
	for (int ia = 0; ia < ndisp; ia++) {
		if (!rmoe_dispatch_alltoall(out[ia].d))
			continue;
		for (int i = 0; i < ndisp; i++) {
			if (rmoe_dispatch_alltoall(out[i].d))
				continue;
			const struct rmoe_run_outcome *ring = &out[i], *a2a = &out[ia];
			double pr = total_peak(ring), pa = total_peak(a2a);
			char t[96];
			/* against the first dispatcher: the ratio of each repetition */
			if (i == 0)
				snprintf(t, sizeof(t), "%.2fx [%.2f-%.2f] (median, range of the repetitions)", a2a->ratio_med,
				         a2a->ratio_min, a2a->ratio_max);
			else
				snprintf(t, sizeof(t), "%.2fx (of the medians)", a2a->fb_med / ring->fb_med);
			rmoe_app_say("%s/%s: total peak %.2fx, forward+backward time %s\n", rmoe_dispatch_name(a2a->d),
			             rmoe_dispatch_name(ring->d), pa / pr, t);
			/* Diagnostics, never the headline: each figure alone, and the
			 * execution peak (the total above the resident part). */
			double ha = fmax(a2a->heap_fwd, a2a->heap_bwd), hr = fmax(ring->heap_fwd, ring->heap_bwd);
			char heap[48] = "";
			if (ha > 0 && hr > 0)
				snprintf(heap, sizeof(heap), ", heap figure %.2fx", ha / hr);
			rmoe_app_say("  (diagnostics, %s/%s: StarPU's figure %.2fx%s, execution peak %.2fx)\n",
			             rmoe_dispatch_name(a2a->d), rmoe_dispatch_name(ring->d),
			             fmax(a2a->peak_fwd, a2a->peak_bwd) / fmax(ring->peak_fwd, ring->peak_bwd), heap,
			             (pa - a2a->resident) / (pr - ring->resident));
		}
	}
	for (int i = 0; i < ndisp; i++)
		rmoe_app_say("%-12s forward+backward %.1f ms [%.1f-%.1f] over the interleaved repetitions\n",
		             rmoe_dispatch_name(out[i].d), out[i].fb_med, out[i].fb_min, out[i].fb_max);
	for (int i = 0; i < ndisp && !RMOE_SIMULATED; i++) {
		/* Where rows may leave before the peak (the all-to-alls' token
		 * blocks, token routing's padded partition), the model is a band:
		 * its lower end too. */
		char band[96] = "";
		if (out[i].leave_fwd > 0 || out[i].leave_bwd > 0)
			snprintf(band, sizeof(band), "; less the rows leaving %+.1f%%, %+.1f%%",
			         100.0 * ((out[i].model_fwd - out[i].leave_fwd) / out[i].peak_fwd - 1.0),
			         100.0 * ((out[i].model_bwd - out[i].leave_bwd) / out[i].peak_bwd - 1.0));
		rmoe_app_say("model %-12s (routing skew %.3f): peak fwd %.1f MiB (%+.1f%%), bwd %.1f MiB (%+.1f%%) "
		             "against the measured%s\n",
		             rmoe_dispatch_name(out[i].d), out[i].skew, out[i].model_fwd / MiB,
		             100.0 * (out[i].model_fwd / out[i].peak_fwd - 1.0), out[i].model_bwd / MiB,
		             100.0 * (out[i].model_bwd / out[i].peak_bwd - 1.0), band);
	}
	/* The model against the independent figure, with the runtime's
	 * structures the heap holds beside the data (the graph's handles,
	 * tasks and requests): what neither counts (scratch, MPI's buffers,
	 * slack) shows here. */
	for (int i = 0; i < ndisp && !RMOE_SIMULATED; i++)
		rmoe_app_say("model %-12s + runtime %.1f/%.1f MiB against the heap: fwd %.1f MiB (model %+.1f%%), "
		             "bwd %.1f MiB (model %+.1f%%)\n",
		             rmoe_dispatch_name(out[i].d), out[i].runtime_fwd / MiB, out[i].runtime_bwd / MiB,
		             out[i].heap_fwd / MiB, 100.0 * ((out[i].model_fwd + out[i].runtime_fwd) / out[i].heap_fwd - 1.0),
		             out[i].heap_bwd / MiB, 100.0 * ((out[i].model_bwd + out[i].runtime_bwd) / out[i].heap_bwd - 1.0));
	for (int i = 1; i < ndisp && !RMOE_SIMULATED; i++) {
		const char *worst;
		double diff = rmoe_results_max_rel_diff(&res[0], &res[i], prob, &worst);
		rmoe_app_say("largest relative difference %s vs %s: %.2e (%s)\n", rmoe_dispatch_name(out[0].d),
		             rmoe_dispatch_name(out[i].d), diff, worst);
	}
}

/* The table, one row per dispatcher, the memory cap's chunks and what the
 * columns mean. */
static void print_table(const struct rmoe_run_report *rep)
{
	const struct rmoe_run_outcome *out = rep->out;
	const int ndisp = rep->ndisp;
	int device = 0;
	for (int i = 0; i < ndisp; i++)
		device |= out[i].device_fwd > 0 || out[i].device_bwd > 0;
	rmoe_app_say("\n%-12s %9s %9s %11s %11s %9s %9s %10s %11s %9s %9s%s\n", "", "fwd ms", "bwd ms", "peak fwd",
	             "peak bwd", "heap fwd", "heap bwd", "TOTAL", "exec peak", "peak RSS", "sent",
	             device ? "  dev fwd   dev bwd" : "");
	rmoe_app_say("%-12s %9s %9s %11s %11s %9s %9s %10s %11s %9s %9s%s\n", "", "(median)", "(median)", "MiB", "MiB",
	             "MiB", "MiB", "MiB", "(diag) MiB", "MiB", "MiB/rank", device ? "       MiB       MiB" : "");
	for (int i = 0; i < ndisp; i++)
		print_outcome(&out[i], device);
	for (int i = 0; i < ndisp; i++)
		if (rep->cfg->mem_cap > 0 && rmoe_dispatcher_of(out[i].d)->capped)
			rmoe_app_say("%s: memory cap %.3f MiB -> %s in chunks of %lld rows; measured peak %.3f MiB (TOTAL)\n",
			             rmoe_dispatch_name(out[i].d), (double)rep->cfg->mem_cap / MiB,
			             rmoe_dispatcher_of(out[i].d)->chunked, (long long)out[i].chunk_rows,
			             total_peak(&out[i]) / MiB);
#ifdef RMOE_SIMGRID
	rmoe_app_say("(simulated: times are SimGrid's simulated time, max over ranks; peak = the memory model's "
	             "(model), no task samples memory in a simulation, TOTAL = its larger pass; exec peak = a "
	             "diagnostic, TOTAL above the %.1f MiB resident; peak RSS is the simulator's whole process)\n",
	             out[0].resident / MiB);
#else
	rmoe_app_say("(max over ranks; peak = the layer's StarPU data, sampled at every task; heap = the same "
	             "resident part plus the process heap's growth (malloc'ed, whoever by), sampled at every task and "
	             "every 0.5 ms; TOTAL = the headline metric, the larger of peak and heap over both passes; exec "
	             "peak = a diagnostic, TOTAL above the %.1f MiB resident: weights, gradients, inputs, routing; "
	             "peak RSS: the process, which holds every dispatcher's layer)\n",
	             out[0].resident / MiB);
	if (device)
		rmoe_app_say("(dev = StarPU's bytes on the GPU, weights and inputs there included, %s)\n",
		             strcmp(device_cache_mode(), "off")
		                     ? "its cache of freed device buffers too (RMOE_DEVICE_CACHE=off: the data's own)"
		                     : "freed buffers returned at once (RMOE_DEVICE_CACHE=off): the data's own");
#endif
}

/* --check: each dispatcher against the reference; 0, or 1 past the
 * tolerance. */
static int check_all(const struct rmoe_run_report *rep)
{
	const double tol = rep->cfg->dtype == RMOE_DTYPE_BF16 ? CHECK_TOLERANCE_BF16 : CHECK_TOLERANCE_F32;
	int exit_code = 0;
	for (int i = 0; i < rep->ndisp; i++) {
		const char *worst;
		int64_t ties;
		double err = rmoe_results_check(&rep->res[i], rep->prob, &worst, &ties);
		int ok = err <= tol;
		rmoe_app_say("check %s vs reference: largest relative error %.2e (%s), %lld near-tie routing "
		             "choice(s); tolerance %.0e: %s\n",
		             rmoe_dispatch_name(rep->out[i].d), err, worst, (long long)ties, tol, ok ? "PASS" : "FAIL");
		if (!ok)
			exit_code = 1;
	}
	return exit_code;
}

int rmoe_run_report(const struct rmoe_run_report *rep)
{
	const struct rmoe_run_outcome *out = rep->out;
	print_table(rep);
	print_comparisons(out, rep->res, rep->ndisp, rep->prob);
	int exit_code = rep->check ? check_all(rep) : 0;
	if (exit_code == 0 && rep->dump) {
		if (rmoe_results_dump(&rep->res[0], rep->prob, rep->dump))
			exit_code = 1;
		else
			rmoe_app_say("wrote inputs and %s outputs to %s/\n", rmoe_dispatch_name(out[0].d), rep->dump);
	}
	if (exit_code == 0 && rep->csv && rmoe_app_agree(write_csv(rep)))
		exit_code = 1;
	if (exit_code == 0 && rep->routing && rmoe_app_agree(write_routing(rep->routing, rep->prob, rep->res[0].topk_idx)))
		exit_code = 1;
	return exit_code;
}
