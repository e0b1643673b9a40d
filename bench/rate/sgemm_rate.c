/* OpenBLAS sgemm on the GEMMs a relaymoe layer runs: the machine's GEMM
 * rate against which bench/rate/run.sh sets the layer's.
 *
 * The list is the layer's, call for call, on the same memory layout as the
 * kernels (codelets/kernels/expert.c, router.c), only without their
 * element-wise work (SwiGLU, routing weights, row gathers):
 *   fwd  router logits [T x H][H x E]; per expert with r > 0 rows: gate and
 *        up [r x H][H x F], down [r x F][F x H]             (6 r H F + 2 T H E)
 *   bwd  per expert: the recomputed gate and up; u = dy w_down^T,
 *        dw_down = act^T dy, dw_gate = x^T dgate, dw_up = x^T dup,
 *        dx = dgate w_gate^T + dup w_up^T (8 GEMMs of 2 r H F); the router's
 *        dw_router = x^T dlogits and dx += dlogits w_router^T (16 r H F + 4 T H E)
 * --fused gives gate and up one [H x 2F] weight: one GEMM where the kernel
 * runs two (forward, recompute, dw_gate/dw_up, dx), the same flops.
 *
 *   sgemm_rate --hidden H --ffn F --experts E --tokens T (per rank)
 *              [--topk K] [--routing FILE] --pass fwd|bwd [--threads N]
 *              [--streams S] [--fused] [--reps R] [--min-time SEC] [--header]
 *
 * --routing: `relaymoe run --routing` (rank,expert,rows); stream s runs the
 * list of rank s mod (ranks in FILE). Without it, T*K rows spread evenly
 * over the experts (needs --topk). --threads: OpenBLAS threads of each call
 * (one stream); --streams: that many threads each running its own list
 * with one-threaded OpenBLAS, started together (several workers or ranks
 * on the cores). After one untimed list, each timed repetition runs the
 * list enough times to last --min-time (0.2 s; 0: once); prints one CSV
 * line: the flops of all streams (counted from the GEMMs run), the median,
 * min and max seconds of one list and the rates, over R (3) repetitions. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/sgemm_list.h"

#define MAX_RANKS 1024

struct setup {
	long H, F, E, T, K;
	int bwd, fused, threads, streams, reps;
	double min_s;
	int nranks;
	long *rows;          /* [nranks x E] */
};

struct stream {
	const struct setup *s;
	int rank;
	struct bench_gemm *list;
	int n;
	float *bufs[16];
	int nbufs;
	pthread_barrier_t *go, *done;
	long inner;
	int runs;            /* lists to run, the warm-up first */
	double start, end;   /* of this stream's last run */
};

static float *stream_buf(struct stream *st, size_t n)
{
	float *p = bench_filled(n ? n : 1);
	st->bufs[st->nbufs++] = p;
	return p;
}

/* The list of one rank's GEMMs, on buffers laid out as the kernels'. */
static void build_list(struct stream *st)
{
	const struct setup *s = st->s;
	const long H = s->H, F = s->F, E = s->E, T = s->T, HF = H * F;
	const long *rows = s->rows + (long)st->rank * E;
	long R = 0;
	for (long e = 0; e < E; e++)
		R += rows[e];
	float *x = stream_buf(st, (size_t)(R * H)), *dy = stream_buf(st, (size_t)(R * H));
	float *out = stream_buf(st, (size_t)(R * H)), *work = stream_buf(st, (size_t)(R * 4 * F));
	float *w = stream_buf(st, (size_t)(E * 3 * HF)), *dw = stream_buf(st, (size_t)(E * 3 * HF));
	float *xt = stream_buf(st, (size_t)(T * H)), *wr = stream_buf(st, (size_t)(H * E));
	float *logits = stream_buf(st, (size_t)(T * E)), *dwr = stream_buf(st, (size_t)(H * E));
	float *dxt = stream_buf(st, (size_t)(T * H));
	float *gate = work, *up = work + R * F, *act = work + 2 * R * F, *u = work + 3 * R * F;
	st->list = calloc((size_t)(8 * E + 2), sizeof(struct bench_gemm));
	if (!st->list) {
		fprintf(stderr, "sgemm_rate: out of memory\n");
		exit(1);
	}
	struct bench_gemm *g = st->list;
	if (!s->bwd)
		*g++ = (struct bench_gemm){0, 0, (int)T, (int)E, (int)H, xt, wr, logits, 0.0f};
	long o = 0;
	for (long e = 0; e < E; o += rows[e], e++) {
		const int r = (int)rows[e], h = (int)H, f = (int)F;
		if (r == 0)
			continue;
		/* the expert's weights: gate [H x F], up [H x F] (together the
		 * fused [H x 2F]), down [F x H]; dx goes to out, not over x as in
		 * the kernel, so that repeated lists keep their values bounded */
		const float *wg = w + e * 3 * HF, *wu = wg + HF, *wd = wg + 2 * HF;
		float *dwg = dw + e * 3 * HF, *dwu = dwg + HF, *dwd = dwg + 2 * HF;
		const float *xe = x + o * H, *dye = dy + o * H;
		float *oute = out + o * H;
		if (s->fused) {
			float *gu = gate + o * 2 * F;
			*g++ = (struct bench_gemm){0, 0, r, 2 * f, h, xe, wg, gu, 0.0f};
		} else {
			*g++ = (struct bench_gemm){0, 0, r, f, h, xe, wg, gate + o * F, 0.0f};
			*g++ = (struct bench_gemm){0, 0, r, f, h, xe, wu, up + o * F, 0.0f};
		}
		if (!s->bwd) {
			*g++ = (struct bench_gemm){0, 0, r, h, f, act + o * F, wd, oute, 0.0f};
			continue;
		}
		*g++ = (struct bench_gemm){0, 1, r, f, h, dye, wd, u + o * F, 0.0f};
		*g++ = (struct bench_gemm){1, 0, f, h, r, act + o * F, dye, dwd, 0.0f};
		if (s->fused) {
			float *gu = gate + o * 2 * F;
			*g++ = (struct bench_gemm){1, 0, h, 2 * f, r, xe, gu, dwg, 0.0f};
			*g++ = (struct bench_gemm){0, 1, r, h, 2 * f, gu, wg, oute, 0.0f};
		} else {
			*g++ = (struct bench_gemm){1, 0, h, f, r, xe, gate + o * F, dwg, 0.0f};
			*g++ = (struct bench_gemm){1, 0, h, f, r, xe, up + o * F, dwu, 0.0f};
			*g++ = (struct bench_gemm){0, 1, r, h, f, gate + o * F, wg, oute, 0.0f};
			*g++ = (struct bench_gemm){0, 1, r, h, f, up + o * F, wu, oute, 1.0f};
		}
	}
	if (s->bwd) {
		*g++ = (struct bench_gemm){1, 0, (int)H, (int)E, (int)T, xt, logits, dwr, 0.0f};
		*g++ = (struct bench_gemm){0, 1, (int)T, (int)H, (int)E, logits, wr, dxt, 0.0f};
	}
	st->n = (int)(g - st->list);
}

/* A stream's lists: the warm-up (the repetitions' inner count comes from
 * its time), then the repetitions, each between two barriers. Each stream
 * stamps its own start and end: the main thread may be scheduled late on
 * busy cores. */
static void *stream_main(void *arg)
{
	struct stream *st = arg;
	for (int run = 0; run < st->runs; run++) {
		pthread_barrier_wait(st->go);
		long n = run < 1 ? 1 : st->inner;
		st->start = bench_now();
		for (long i = 0; i < n; i++)
			bench_gemm_run(st->list, st->n);
		st->end = bench_now();
		pthread_barrier_wait(st->done);
	}
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static int read_routing(const char *path, struct setup *s)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "sgemm_rate: --routing %s: %s\n", path, strerror(errno));
		return -1;
	}
	s->rows = calloc((size_t)(MAX_RANKS * s->E), sizeof(long));
	char line[256];
	int ok = s->rows && fgets(line, sizeof(line), f) && !strncmp(line, "rank,expert,rows", 16);
	long r, e, n, lineno = 1;
	s->nranks = 0;
	while (ok && fgets(line, sizeof(line), f)) {
		lineno++;
		if (sscanf(line, "%ld,%ld,%ld", &r, &e, &n) != 3 || r < 0 || r >= MAX_RANKS || e < 0 || e >= s->E ||
		    n < 0) {
			fprintf(stderr, "sgemm_rate: --routing %s line %ld: expected rank,expert,rows with 0 <= expert < "
			        "%ld and rows >= 0\n", path, lineno, s->E);
			ok = 0;
			break;
		}
		s->rows[r * s->E + e] = n;
		if (r + 1 > s->nranks)
			s->nranks = (int)r + 1;
	}
	fclose(f);
	if (ok && s->nranks == 0)
		fprintf(stderr, "sgemm_rate: --routing %s: no rows\n", path), ok = 0;
	for (int q = 0; ok && s->K > 0 && q < s->nranks; q++) {
		long sum = 0;
		for (long x = 0; x < s->E; x++)
			sum += s->rows[q * s->E + x];
		if (sum != s->T * s->K) {
			fprintf(stderr, "sgemm_rate: --routing %s: rank %d routed %ld rows, expected T*K = %ld\n", path, q,
			        sum, s->T * s->K);
			ok = 0;
		}
	}
	return ok ? 0 : -1;
}

static void usage(void)
{
	fprintf(stderr, "usage: sgemm_rate --hidden H --ffn F --experts E --tokens T [--topk K] [--routing FILE]\n"
	                "                  --pass fwd|bwd [--threads N] [--streams S] [--fused] [--reps R]\n"
	                "                  [--min-time SEC] [--header]\n");
}

int main(int argc, char **argv)
{
	struct setup s = {.threads = 1, .streams = 1, .reps = 3, .min_s = 0.2, .bwd = -1};
	const char *routing = NULL;
	int header = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		long *num = !strcmp(a, "--hidden") ? &s.H : !strcmp(a, "--ffn") ? &s.F : !strcmp(a, "--experts") ? &s.E
		          : !strcmp(a, "--tokens") ? &s.T : !strcmp(a, "--topk") ? &s.K : NULL;
		int *inum = !strcmp(a, "--threads") ? &s.threads : !strcmp(a, "--streams") ? &s.streams
		          : !strcmp(a, "--reps") ? &s.reps : NULL;
		if (num || inum) {
			char *end;
			long x = v ? strtol(v, &end, 10) : 0;
			if (!v || *end || x < 1 || x > 1000000000) {
				fprintf(stderr, "sgemm_rate: %s '%s': expected a positive integer\n", a, v ? v : "");
				return 2;
			}
			if (num)
				*num = x;
			else
				*inum = (int)x;
			i++;
		} else if (!strcmp(a, "--pass") && v && (!strcmp(v, "fwd") || !strcmp(v, "bwd"))) {
			s.bwd = !strcmp(v, "bwd");
			i++;
		} else if (!strcmp(a, "--min-time") && v) {
			char *end;
			s.min_s = strtod(v, &end);
			if (*end || !(s.min_s >= 0 && s.min_s <= 3600)) {
				fprintf(stderr, "sgemm_rate: --min-time '%s': expected seconds (0 to 3600)\n", v);
				return 2;
			}
			i++;
		} else if (!strcmp(a, "--routing") && v) {
			routing = v;
			i++;
		} else if (!strcmp(a, "--fused")) {
			s.fused = 1;
		} else if (!strcmp(a, "--header")) {
			header = 1;
		} else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage();
			return 0;
		} else {
			fprintf(stderr, "sgemm_rate: bad option '%s'%s\n", a, v ? "" : " (or its value is missing)");
			usage();
			return 2;
		}
	}
	if (header) {
		printf("pass,threads,streams,layout,gemms,flops,secs_median,secs_min,secs_max,gflops_median,gflops_min,"
		       "gflops_max\n");
		return 0;
	}
	if (!s.H || !s.F || !s.E || !s.T || s.bwd < 0 || (!routing && !s.K)) {
		fprintf(stderr, "sgemm_rate: --hidden, --ffn, --experts, --tokens, --pass and --routing or --topk "
		                "are required\n");
		usage();
		return 2;
	}
	if (s.streams > 1 && s.threads > 1) {
		fprintf(stderr, "sgemm_rate: --streams %d runs one-threaded calls; --threads %d with it would "
		                "oversubscribe\n", s.streams, s.threads);
		return 2;
	}
	if (routing) {
		if (read_routing(routing, &s))
			return 1;
	} else {
		s.nranks = 1;
		s.rows = calloc((size_t)s.E, sizeof(long));
		if (!s.rows)
			return 1;
		for (long e = 0; e < s.E; e++)
			s.rows[e] = s.T * s.K / s.E + (e < s.T * s.K % s.E);
	}
#ifdef OPENBLAS_VERSION
	openblas_set_num_threads(s.threads);
#endif
	struct stream *st = calloc((size_t)s.streams, sizeof(*st));
	pthread_t *tid = calloc((size_t)s.streams, sizeof(*tid));
	pthread_barrier_t go, done;
	if (!st || !tid || pthread_barrier_init(&go, NULL, (unsigned)s.streams + 1) ||
	    pthread_barrier_init(&done, NULL, (unsigned)s.streams + 1)) {
		fprintf(stderr, "sgemm_rate: out of memory\n");
		return 1;
	}
	double flops = 0;
	int gemms = 0;
	for (int i = 0; i < s.streams; i++) {
		st[i] = (struct stream){.s = &s, .rank = i % s.nranks, .go = &go, .done = &done, .runs = 1 + s.reps};
		build_list(&st[i]);
		flops += bench_gemm_flops(st[i].list, st[i].n);
		gemms += st[i].n;
	}
	for (int i = 0; i < s.streams; i++)
		if (pthread_create(&tid[i], NULL, stream_main, &st[i])) {
			fprintf(stderr, "sgemm_rate: cannot start stream %d\n", i);
			return 1;
		}
	double *secs = calloc((size_t)s.reps, sizeof(double));
	for (int run = 0; run < 1 + s.reps; run++) {
		pthread_barrier_wait(&go);
		pthread_barrier_wait(&done);
		/* from the first stream's start to the last one's end */
		double t0 = st[0].start, t1 = st[0].end;
		for (int i = 1; i < s.streams; i++) {
			t0 = st[i].start < t0 ? st[i].start : t0;
			t1 = st[i].end > t1 ? st[i].end : t1;
		}
		double t = t1 - t0;
		if (run == 0) {
			/* how many lists make a repetition; the streams read it after
			 * the next barrier */
			long inner = t > 0 ? (long)ceil(s.min_s / t) : 1;
			for (int i = 0; i < s.streams; i++)
				st[i].inner = inner < 1 ? 1 : inner;
		} else {
			secs[run - 1] = t / (double)st[0].inner;
		}
	}
	for (int i = 0; i < s.streams; i++)
		pthread_join(tid[i], NULL);
	qsort(secs, (size_t)s.reps, sizeof(double), cmp_double);
	double med = secs[s.reps / 2];
	printf("%s,%d,%d,%s,%d,%.6e,%.6f,%.6f,%.6f,%.3f,%.3f,%.3f\n", s.bwd ? "bwd" : "fwd", s.threads, s.streams,
	       s.fused ? "fused" : "kernel", gemms, flops, med, secs[0], secs[s.reps - 1],
	       flops / med / 1e9, flops / secs[s.reps - 1] / 1e9, flops / secs[0] / 1e9);
	for (int i = 0; i < s.streams; i++) {
		for (int b = 0; b < st[i].nbufs; b++)
			free(st[i].bufs[b]);
		free(st[i].list);
	}
	free(st), free(tid), free(secs), free(s.rows);
	return 0;
}
