/* relaymoe train: a small MoE language model trained on the library's layers
 * (apps/train/model.h) with AdamW, on a seeded Markov chain or a byte-level
 * text, with checkpoints that resume bit for bit. The N ranks of the run are
 * the expert-parallel group; every rank trains on its own tokens. */
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "app.h"
#include "messages.h"
#include "options.h"
#include "problem.h"
#include "rmoe_scheduler.h"
#include "rmoe_system.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/model.h"
#include "train/optimizer.h"

#ifndef RMOE_TRAIN_PLOT_SCRIPT
#define RMOE_TRAIN_PLOT_SCRIPT "bench/train_plot.py"
#endif
#define PYTHON "/usr/bin/python3"

extern char **environ;

struct train_opts {
	struct rmoe_shape_opts shape;
	int64_t layers, vocab, steps, seed, warmup, branching, checkpoint_every, print_every;
	double lr, weight_decay, clip, aux_weight;
	const char *dispatch, *text, *csv, *png, *checkpoint_dir;
	int resume, quiet, g_vocab;
};

static const char *usage_head =
	"usage: mpirun -np N relaymoe train [options]\n"
	"\n"
	"Trains a small MoE language model: token embedding, L blocks of RMSNorm and an\n"
	"MoE layer (router, top-k SwiGLU experts on the N ranks, ring or all-to-all\n"
	"dispatch) with residuals, final RMSNorm and output head, next-token\n"
	"cross-entropy plus a load-balancing loss, AdamW with global-norm clipping.\n"
	"Every rank trains on its own T tokens a step; the loss is the mean over all.\n"
	"The corpus is a sparse random Markov chain drawn from the seed (the loss can\n"
	"fall from ln V to the chain's entropy rate, printed as the floor), or with\n"
	"--text the bytes of a file (V = 256; floor: the file's bigram entropy).\n"
	"\n";

static const char *usage_tail =
	"\n"
	"The model sees one token at a time (no attention), so the floor is the\n"
	"entropy of the next token given the current one.\n"
	"--csv writes step, loss, aux_loss, grad_norm, lr, seconds, tokens_per_s,\n"
	"peak_layer_bytes, peak_rss_bytes, floor_nats per step (temporary name, then\n"
	"renamed); --png plots it with " PYTHON " and matplotlib.\n"
	"--checkpoint-dir D writes D/rank-NNNNN.ckpt per rank every --checkpoint-every\n"
	"steps and at the end; --resume continues from them bit for bit.\n";

/* The options of relaymoe train, set by set, into r: as rmoe_app_options. */
static int parse_options(struct train_opts *r, int argc, char **argv, int first, char *msg, size_t len)
{
	const struct rmoe_opt model[] = {
		{"layers", RMOE_OPT_INT, &r->layers, 1, 4096, "L", "MoE blocks", NULL},
		RMOE_SHAPE_OPTIONS(&r->shape),
		{"vocab", RMOE_OPT_INT, &r->vocab, 2, 1e7, "V", "vocabulary size, 256 with --text", &r->g_vocab},
	};
	const struct rmoe_opt training[] = {
		{"steps", RMOE_OPT_INT, &r->steps, 0, 1e9, "S", "train up to step S", NULL},
		RMOE_SEED_OPTION(&r->seed),
		{"dispatch", RMOE_OPT_STRING, &r->dispatch, 0, 0, "ring|a2a|a2a-megatron|a2a-deepep", "MoE dispatcher", NULL},
		{"lr", RMOE_OPT_DOUBLE, &r->lr, 0, 10, "LR", "peak learning rate", NULL},
		{"warmup", RMOE_OPT_INT, &r->warmup, 0, 1e9, "S", "linear warm-up steps", NULL},
		{"weight-decay", RMOE_OPT_DOUBLE, &r->weight_decay, 0, 10, "W", "AdamW decay of matrices", NULL},
		{"clip", RMOE_OPT_DOUBLE, &r->clip, 0, 1e12, "C", "global gradient-norm clip, 0: none", NULL},
		{"aux-weight", RMOE_OPT_DOUBLE, &r->aux_weight, 0, 1e3, "A", "load-balancing loss weight", NULL},
	};
	const struct rmoe_opt data[] = {
		{"branching", RMOE_OPT_INT, &r->branching, 1, 1e6, "B", "successors per token of the chain", NULL},
		{"text", RMOE_OPT_STRING, &r->text, 0, 0, "FILE", "train on the bytes of FILE", NULL},
	};
	const struct rmoe_opt output[] = {
		{"csv", RMOE_OPT_STRING, &r->csv, 0, 0, "FILE", "write the loss curve", NULL},
		{"png", RMOE_OPT_STRING, &r->png, 0, 0, "FILE", "plot the loss curve (needs --csv)", NULL},
		{"checkpoint-dir", RMOE_OPT_STRING, &r->checkpoint_dir, 0, 0, "D", "checkpoint directory", NULL},
		{"checkpoint-every", RMOE_OPT_INT, &r->checkpoint_every, 0, 1e9, "S", "checkpoint every S steps (0: at the end only)", NULL},
		{"resume", RMOE_OPT_FLAG, &r->resume, 0, 0, NULL, "continue from --checkpoint-dir", NULL},
		{"print-every", RMOE_OPT_INT, &r->print_every, 1, 1e9, "S", "progress line every S steps", NULL},
		{"quiet", RMOE_OPT_FLAG, &r->quiet, 0, 0, NULL, "no progress lines", NULL},
	};
	const struct rmoe_opt_set sets[] = {
		RMOE_OPT_SET("the model", model, NULL),
		RMOE_OPT_SET("training", training, NULL),
		RMOE_OPT_SET("the corpus", data, NULL),
		RMOE_OPT_SET("output and checkpoints", output, NULL),
	};
	return rmoe_app_options(sets, RMOE_NELEMS(sets), argc, argv, first, usage_head, usage_tail, msg, len);
}

static int check_opts(struct train_opts *r, int nranks, struct rmoe_train_shape *shape,
                      enum rmoe_dispatch *d, char *msg, size_t len)
{
	/* Training runs expert routing's ring or an all-to-all: auto would
	 * choose per layer, and token routing is not among the trainer's tests. */
	const struct rmoe_dispatcher *row = rmoe_dispatch_parse(r->dispatch, d) ? NULL : rmoe_dispatcher_of(*d);
	const int ring = row && row->family == RMOE_FAMILY_RING;
	if (!row || row->family == RMOE_FAMILY_CHOICE || (ring && strcmp(row->mode, "expert"))) {
		snprintf(msg, len, "--dispatch '%s': expected ring, a2a, a2a-megatron or a2a-deepep", r->dispatch);
		return RMOE_EINVAL;
	}
	if (r->text) {
		if (r->g_vocab && r->vocab != 256) {
			snprintf(msg, len, "--vocab %lld with --text: a byte-level corpus has 256 tokens",
			         (long long)r->vocab);
			return RMOE_EINVAL;
		}
		r->vocab = 256;
	}
	if ((r->resume || r->checkpoint_every) && !r->checkpoint_dir) {
		snprintf(msg, len, "%s needs --checkpoint-dir", r->resume ? "--resume" : "--checkpoint-every");
		return RMOE_EINVAL;
	}
	if (r->png && !r->csv) {
		snprintf(msg, len, "--png plots the --csv file: give --csv too");
		return RMOE_EINVAL;
	}
	*shape = (struct rmoe_train_shape){r->layers, r->shape.hidden, r->shape.ffn, r->shape.experts, r->shape.topk, r->vocab,
	                                   r->shape.tokens, r->shape.shared_ffn};
	struct rmoe_layer_config cfg;
	rmoe_app_layer_shape(&cfg, r->shape.hidden, r->shape.ffn, r->shape.experts, r->shape.topk, r->shape.tokens);
	cfg.shared_ffn = r->shape.shared_ffn;
	cfg.dispatch = *d;
	cfg.deterministic = 1;
	int rc = rmoe_config_check(&cfg, nranks);
	if (rc)
		snprintf(msg, len, "%s", rmoe_strerror(rc));
	return rc;
}

static void make_identity(const struct train_opts *r, enum rmoe_dispatch d, const struct rmoe_corpus *c,
                          const struct rmoe_adamw_config *ac, struct rmoe_ckpt_identity *id)
{
	memset(id, 0, sizeof(*id));
	*id = (struct rmoe_ckpt_identity){
		.layers = r->layers, .hidden = r->shape.hidden, .ffn = r->shape.ffn, .experts = r->shape.experts,
		.topk = r->shape.topk, .vocab = r->vocab, .tokens = r->shape.tokens, .shared_ffn = r->shape.shared_ffn,
		.seed = r->seed, .dispatch = d, .corpus_kind = c->kind,
		.branching = c->kind == RMOE_CORPUS_MARKOV ? c->branching : 0, .warmup = ac->warmup,
		.corpus_hash = c->content_hash, .lr = ac->lr, .beta1 = ac->beta1, .beta2 = ac->beta2,
		.eps = ac->eps, .weight_decay = ac->weight_decay, .clip = ac->clip,
		.aux_weight = r->aux_weight,
	};
}

/* Rank 0 writes the curve so far to path (temporary name, then rename). */
static int write_curve(const char *path, const struct rmoe_train_record *h, int64_t n, double floor_nats)
{
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (rank != 0)
		return 0;
	char tmp[4096];
	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
	FILE *f = fopen(tmp, "w");
	if (!f) {
		rmoe_app_error("--csv %s: cannot create %s (%s)", path, tmp, strerror(errno));
		return RMOE_EIO;
	}
	fprintf(f, "step,loss,aux_loss,grad_norm,lr,seconds,tokens_per_s,peak_layer_bytes,peak_rss_bytes,"
	           "floor_nats\n");
	/* %.17g: the loss columns of two runs compare bit for bit. */
	for (int64_t i = 0; i < n; i++) {
		fprintf(f, "%lld,%.17g,%.17g,%.17g,%.17g,", (long long)h[i].step, h[i].loss, h[i].aux,
		        h[i].grad_norm, h[i].lr);
		/* Steps of an earlier process (before a resume) have no timings. */
		if (h[i].peak_layer_bytes >= 0)
			fprintf(f, "%.6f,%.1f,%lld,%lld,%.9g\n", h[i].seconds, h[i].tokens_per_s,
			        (long long)h[i].peak_layer_bytes, (long long)h[i].peak_rss_bytes, floor_nats);
		else
			fprintf(f, "nan,nan,nan,nan,%.9g\n", floor_nats);
	}
	int bad = fflush(f) != 0 || ferror(f);
	bad |= fclose(f) != 0;
	if (bad || rename(tmp, path) != 0) {
		rmoe_app_error("--csv %s: write failed (%s)", path, strerror(errno));
		unlink(tmp);
		return RMOE_EIO;
	}
	return 0;
}

/* Rank 0 runs the plotting script; a missing interpreter or matplotlib
 * skips the plot with a message and is not an error. */
static void plot_curve(const char *csv, const char *png)
{
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (rank != 0)
		return;
	if (access(PYTHON, X_OK) != 0) {
		rmoe_app_say("skipping the plot: %s not found\n", PYTHON);
		return;
	}
	const char *script = rmoe_env(RMOE_ENV_TRAIN_PLOT);
	if (!script)
		script = RMOE_TRAIN_PLOT_SCRIPT;
	char *argv[] = {PYTHON, (char *)script, "--out", (char *)png, (char *)csv, NULL};
	pid_t pid;
	if (posix_spawn(&pid, PYTHON, NULL, NULL, argv, environ) != 0) {
		rmoe_app_say("skipping the plot: cannot start %s\n", PYTHON);
		return;
	}
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		rmoe_app_say("the plot script %s failed (status %d)\n", script, status);
}

static const double MiB = 1024.0 * 1024.0;

/* The options, defaults from the optimizer's, checked; the optimizer's
 * configuration from them. 0, 1 after --help, or a negative RMOE_E* code
 * with msg. */
static int configure(struct train_opts *r, struct rmoe_adamw_config *ac, struct rmoe_train_shape *shape,
                     enum rmoe_dispatch *dispatch, int argc, char **argv, int first, char *msg, size_t len)
{
	rmoe_adamw_config_init(ac);
	r->lr = ac->lr;
	r->warmup = ac->warmup;
	r->weight_decay = ac->weight_decay;
	r->clip = ac->clip;
	int prc = parse_options(r, argc, argv, first, msg, len);
	if (prc)
		return prc;
	int nranks;
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	if ((prc = check_opts(r, nranks, shape, dispatch, msg, len)))
		return prc;
	ac->lr = r->lr;
	ac->warmup = r->warmup;
	ac->weight_decay = r->weight_decay;
	ac->clip = r->clip;
	return 0;
}

/* A training run, from its setup to its end. */
struct trainer {
	const struct train_opts *r;
	const struct rmoe_adamw_config *ac;
	struct rmoe_corpus *corpus;
	struct rmoe_train_model model;
	struct rmoe_adamw opt;
	struct rmoe_ckpt_state state;
	struct rmoe_ckpt_identity id;
	int32_t *seq;                  /* a step's tokens and their successor */
	int rank, nranks;
};

/* The model, the optimizer, the corpus' position (from the checkpoint with
 * --resume) and room for the loss history; collective, 0 or an RMOE_E*
 * code. */
static int trainer_setup(struct trainer *t, rmoe_ctx *ctx, const struct rmoe_train_shape *shape,
                         enum rmoe_dispatch dispatch)
{
	const struct train_opts *r = t->r;
	make_identity(r, dispatch, t->corpus, t->ac, &t->id);
	t->seq = malloc((size_t)(r->shape.tokens + 1) * sizeof(int32_t));
	int rc = rmoe_train_model_init(&t->model, ctx, shape, dispatch, r->aux_weight, (uint64_t)r->seed);
	if (!rc) {
		rc = rmoe_adamw_init(&t->opt, t->ac, &t->model);
		if (!rc && !t->seq)
			rc = RMOE_ENOMEM;
		if (rc)
			rmoe_app_error("out of host memory for the optimizer state");
		rc = rmoe_app_agree(rc);
	}
	if (!rc && r->resume) {
		rc = rmoe_ckpt_load(r->checkpoint_dir, &t->id, &t->state, &t->model, &t->opt);
		if (!rc)
			rc = rmoe_train_model_push(&t->model);
	} else if (!rc) {
		rmoe_corpus_start(t->corpus, t->rank, &t->state.data);
	}
	int64_t capacity = r->steps > t->state.step ? r->steps : t->state.step;
	if (!rc) {
		struct rmoe_train_record *grown = realloc(t->state.history, (size_t)(capacity + 1) * sizeof(*grown));
		if (grown)
			t->state.history = grown;
		else
			rmoe_app_error("out of host memory for the loss history");
		rc = rmoe_app_agree(grown ? 0 : RMOE_ENOMEM);
	}
	return rc;
}

/* What is trained, on what, and from where. */
static void print_header(const struct trainer *t)
{
	const struct train_opts *r = t->r;
	const struct rmoe_adamw_config *ac = t->ac;
	const struct rmoe_corpus *corpus = t->corpus;
	rmoe_app_say("relaymoe train: %d rank(s), %s dispatch; L=%lld H=%lld F=%lld E=%lld K=%lld V=%lld, "
	             "shared FFN %lld; %lld tokens per rank per step; seed %lld\n",
	             t->nranks, r->dispatch, (long long)r->layers, (long long)r->shape.hidden, (long long)r->shape.ffn,
	             (long long)r->shape.experts, (long long)r->shape.topk, (long long)r->vocab,
	             (long long)r->shape.shared_ffn, (long long)r->shape.tokens, (long long)r->seed);
	rmoe_app_say("  parameters: %lld replicated, %lld in experts (%lld on this rank); AdamW lr %g "
	             "(warm-up %lld), weight decay %g, clip %g, aux weight %g\n",
	             (long long)t->model.rep_n, (long long)t->model.exp_n * t->nranks, (long long)t->model.exp_n, ac->lr,
	             (long long)ac->warmup, ac->weight_decay, ac->clip, r->aux_weight);
	if (corpus->kind == RMOE_CORPUS_MARKOV)
		rmoe_app_say("  corpus: Markov chain, %lld successors per token; loss starts near ln V = %.4f, "
		             "floor (entropy rate) %.4f nats\n",
		             (long long)corpus->branching, log((double)r->vocab), corpus->floor_nats);
	else
		rmoe_app_say("  corpus: %s, %lld bytes; loss starts near ln 256 = %.4f, floor (bigram "
		             "entropy) %.4f nats\n",
		             r->text, (long long)corpus->text_len, log(256.0), corpus->floor_nats);
	if (r->resume)
		rmoe_app_say("  resumed from %s at step %lld\n", r->checkpoint_dir, (long long)t->state.step);
}

/* Step state.step + 1: the model's forward and backward, AdamW's update of
 * the clipped gradients, the step's record (the slowest rank's time and
 * the largest peaks) and its progress line; 0 or an RMOE_E* code. */
static int train_step(struct trainer *t)
{
	const struct train_opts *r = t->r;
	struct rmoe_ckpt_state *state = &t->state;
	double t0 = MPI_Wtime();
	int64_t step = state->step + 1;
	rmoe_corpus_next(t->corpus, t->rank, &state->data, r->shape.tokens, t->seq);
	struct rmoe_train_result res;
	int rc = rmoe_train_model_step(&t->model, t->seq, &res);
	if (rc)
		return rc;
	double norm = rmoe_adamw_grad_norm(&t->model);
	double scale = t->ac->clip > 0.0 && norm > t->ac->clip ? t->ac->clip / norm : 1.0;
	double lr = rmoe_adamw_lr(t->ac, step);
	if (!isfinite(res.loss) || !isfinite(norm)) {
		rmoe_app_error("step %lld: loss %g, gradient norm %g: not finite (lower --lr)", (long long)step,
		               res.loss, norm);
		return RMOE_ENONFINITE;
	}
	rmoe_adamw_update(&t->opt, &t->model, step, lr, scale);
	rc = rmoe_train_model_push(&t->model);
	if (rc)
		return rc;
	double worst[3] = {MPI_Wtime() - t0, (double)res.peak_layer_bytes, (double)res.peak_rss_bytes};
	MPI_Allreduce(MPI_IN_PLACE, worst, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	const double global_tokens = (double)r->shape.tokens * t->nranks;
	struct rmoe_train_record *rec = &state->history[state->step];
	*rec = (struct rmoe_train_record){step, res.loss, res.aux, norm, lr, worst[0],
	                                  global_tokens / worst[0], (int64_t)worst[1], (int64_t)worst[2]};
	state->step = step;
	if (!r->quiet && (step % r->print_every == 0 || step == r->steps))
		rmoe_app_say("step %5lld  loss %.4f  aux %.4f  |g| %.3f  lr %.2e  %8.0f tok/s  layer peak "
		             "%.2f MiB  RSS %.1f MiB\n",
		             (long long)step, res.loss, res.aux, norm, lr, rec->tokens_per_s,
		             worst[1] / MiB, worst[2] / MiB);
	return 0;
}

/* Every step up to --steps, with the checkpoints (and the curve so far)
 * every --checkpoint-every steps and one at the end; 0 or an RMOE_E* code. */
static int train_steps(struct trainer *t)
{
	const struct train_opts *r = t->r;
	struct rmoe_ckpt_state *state = &t->state;
	int64_t saved_step = r->resume ? state->step : -1;
	int rc = 0;
	while (!rc && state->step < r->steps) {
		rc = train_step(t);
		const int64_t step = state->step;
		if (!rc && r->checkpoint_dir && r->checkpoint_every > 0 && step % r->checkpoint_every == 0) {
			rc = rmoe_ckpt_save(r->checkpoint_dir, &t->id, state, &t->model, &t->opt);
			if (!rc && r->csv)
				rc = rmoe_app_agree(write_curve(r->csv, state->history, state->step, t->corpus->floor_nats));
			saved_step = step;
		}
	}
	if (!rc && r->checkpoint_dir && saved_step != state->step)
		rc = rmoe_ckpt_save(r->checkpoint_dir, &t->id, state, &t->model, &t->opt);
	return rc;
}

/* After the steps: the replicas compared, the curve written, the summary
 * and the plot; 0 or an RMOE_E* code. */
static int train_finish(struct trainer *t)
{
	const struct train_opts *r = t->r;
	const struct rmoe_ckpt_state *state = &t->state;
	int rc = 0;
	if (!rmoe_train_model_replicas_agree(&t->model)) {
		rmoe_app_error("replicated parameters differ between ranks after step %lld", (long long)state->step);
		rc = RMOE_EMISMATCH;
	}
	if (!rc && r->csv)
		rc = rmoe_app_agree(write_curve(r->csv, state->history, state->step, t->corpus->floor_nats));
	if (!rc && state->step > 0) {
		const struct rmoe_train_record *h = state->history;
		int64_t n = state->step, w = n < 10 ? n : 10;
		double tail = 0.0;
		for (int64_t i = n - w; i < n; i++)
			tail += h[i].loss;
		rmoe_app_say("loss %.4f at step 1, %.4f at step %lld (mean of the last %lld: %.4f); floor %.4f nats\n",
		             h[0].loss, h[n - 1].loss, (long long)n, (long long)w, tail / (double)w,
		             t->corpus->floor_nats);
		if (r->csv)
			rmoe_app_say("wrote %s\n", r->csv);
		if (r->checkpoint_dir)
			rmoe_app_say("checkpoint of step %lld in %s\n", (long long)state->step, r->checkpoint_dir);
	}
	if (!rc && r->png)
		plot_curve(r->csv, r->png);
	return rc;
}

int rmoe_cmd_train(int argc, char **argv, int first)
{
	struct train_opts r = {.shape = {.hidden = 64, .ffn = 32, .experts = 8, .topk = 2, .tokens = 256}, .layers = 2,
	                       .vocab = 64, .steps = 100, .seed = 1, .branching = 4, .print_every = 1,
	                       .weight_decay = 0.1, .aux_weight = 0.01, .dispatch = "ring"};
	struct rmoe_adamw_config ac;
	struct rmoe_train_shape shape;
	enum rmoe_dispatch dispatch = RMOE_DISPATCH_RING_EXPERT;
	char msg[1024];
	int prc = configure(&r, &ac, &shape, &dispatch, argc, argv, first, msg, sizeof(msg));
	if (prc == 1)
		return 0;
	if (prc) {
		rmoe_app_say("relaymoe train: %s\n", msg);
		return 2;
	}

	struct rmoe_corpus corpus;
	int rc = r.text ? rmoe_corpus_text(&corpus, r.text, r.shape.tokens + 1, (uint64_t)r.seed, msg, sizeof(msg))
	                : rmoe_corpus_markov(&corpus, r.vocab, r.branching, (uint64_t)r.seed, msg, sizeof(msg));
	if (rc)
		rmoe_app_error("%s", msg);
	if (rmoe_app_agree(rc)) {
		if (!rc)
			rmoe_corpus_free(&corpus);
		return rc == RMOE_EINVAL ? 2 : 1;
	}

	rmoe_ctx *ctx = NULL;
	rc = rmoe_app_agree(rmoe_ctx_create(&ctx, NULL));
	if (rc) {
		rmoe_app_error("%s", rmoe_strerror(rc));
		if (ctx)
			rmoe_ctx_destroy(ctx);
		rmoe_corpus_free(&corpus);
		return 1;
	}
	struct trainer t = {.r = &r, .ac = &ac, .corpus = &corpus};
	MPI_Comm_size(MPI_COMM_WORLD, &t.nranks);
	MPI_Comm_rank(MPI_COMM_WORLD, &t.rank);
	rc = trainer_setup(&t, ctx, &shape, dispatch);
	if (!rc)
		print_header(&t);
	if (!rc)
		rc = train_steps(&t);
	if (!rc)
		rc = train_finish(&t);

	free(t.seq);
	free(t.state.history);
	rmoe_adamw_free(&t.opt);
	rmoe_train_model_free(&t.model);
	rmoe_corpus_free(&corpus);
	rmoe_ctx_destroy(ctx);
	return rc ? 1 : 0;
}
