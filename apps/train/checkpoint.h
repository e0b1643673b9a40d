/* Checkpoints of `relaymoe train`: every rank writes its own file,
 * DIR/rank-NNNNN.ckpt, holding its parameters (replicated and owned
 * experts), the AdamW moments, the step, its data stream's state and the
 * loss history (no timings: the file is a function of the run's
 * configuration and step, byte for byte), behind a header (magic, version, configuration hash, rank,
 * rank count) and followed by a 64-bit FNV-1a checksum of everything before
 * it. Files are written to a temporary name, flushed and fsync'ed, and
 * renamed only when every rank has written its own, so a failed save leaves
 * the previous checkpoint in place. */
#ifndef RMOE_TRAIN_CHECKPOINT_H
#define RMOE_TRAIN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "data.h"
#include "model.h"
#include "optimizer.h"

#define RMOE_CKPT_VERSION 1

/* Everything that shapes a run's trajectory: a checkpoint resumes only a
 * run whose identity matches field for field. */
struct rmoe_ckpt_identity {
	int64_t layers, hidden, ffn, experts, topk, vocab, tokens, shared_ffn;
	int64_t seed, dispatch, corpus_kind, branching, warmup;
	uint64_t corpus_hash;
	double lr, beta1, beta2, eps, weight_decay, clip, aux_weight;
};

uint64_t rmoe_ckpt_identity_hash(const struct rmoe_ckpt_identity *id);

/* One step of the loss curve. A checkpoint keeps step to lr; a resumed run
 * knows the rest (NaN, -1) only for its own steps. */
struct rmoe_train_record {
	int64_t step;
	double loss, aux, grad_norm, lr;
	double seconds, tokens_per_s;
	int64_t peak_layer_bytes, peak_rss_bytes;
};

/* What a checkpoint carries besides the model's arrays. */
struct rmoe_ckpt_state {
	int64_t step;
	struct rmoe_corpus_state data;
	struct rmoe_train_record *history;  /* [step] records, steps 1..step */
};

/* This rank's file in dir. */
void rmoe_ckpt_path(const char *dir, int rank, char *path, size_t len);

/* Local (no MPI): writes this rank's file to a temporary name, fsync'ed; on
 * success tmp holds that name. 0 or RMOE_EIO with msg naming the file. */
int rmoe_ckpt_write_local(const char *dir, int rank, int nranks, const struct rmoe_ckpt_identity *id,
                          const struct rmoe_ckpt_state *st, const struct rmoe_train_model *m,
                          const struct rmoe_adamw *o, char *tmp, size_t tmplen, char *msg, size_t msglen);

/* Local (no MPI): reads and checks this rank's file (size, magic, version,
 * checksum, rank and rank count, identity), then loads it. history is
 * allocated (free it). 0 or RMOE_EIO (missing, unreadable), RMOE_EFORMAT
 * (truncated, corrupted, not a checkpoint) or RMOE_EMISMATCH (another
 * configuration or rank count), with msg naming the file and the problem.
 * Nothing is loaded unless every check passes. */
int rmoe_ckpt_read_local(const char *dir, int rank, int nranks, const struct rmoe_ckpt_identity *id,
                         struct rmoe_ckpt_state *st, struct rmoe_train_model *m, struct rmoe_adamw *o,
                         char *msg, size_t msglen);

/* Collective: every rank writes, then all rename. On failure every rank
 * prints the first failing rank's message and nothing is renamed. */
int rmoe_ckpt_save(const char *dir, const struct rmoe_ckpt_identity *id, const struct rmoe_ckpt_state *st,
                   const struct rmoe_train_model *m, const struct rmoe_adamw *o);

/* Collective: every rank reads its file; all must succeed and agree on the
 * step. On failure every rank prints the first failing rank's message. */
int rmoe_ckpt_load(const char *dir, const struct rmoe_ckpt_identity *id, struct rmoe_ckpt_state *st,
                   struct rmoe_train_model *m, struct rmoe_adamw *o);

#endif
