/* The training corpus of `relaymoe train`: a sparse random Markov chain over
 * V tokens drawn from the seed (every rank follows its own seeded walk of
 * it), or the bytes of a text file (every rank reads seeded windows of it).
 * The model sees one token at a time (no attention), so the best loss it can
 * reach is the conditional entropy of the next token given the current one:
 * the chain's entropy rate, or the file's bigram entropy; both are computed
 * here and printed as the floor. No MPI: each rank calls these on its own. */
#ifndef RMOE_TRAIN_DATA_H
#define RMOE_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

enum rmoe_corpus_kind {
	RMOE_CORPUS_MARKOV = 1,
	RMOE_CORPUS_TEXT = 2,
};

struct rmoe_corpus {
	enum rmoe_corpus_kind kind;
	int64_t vocab;
	uint64_t seed;
	/* Markov chain: token i moves to succ[i*B + b] with probability
	 * cum[i*B + b] - cum[i*B + b - 1]. */
	int64_t branching;
	int32_t *succ;
	double *cum;
	/* text: the whole file */
	unsigned char *text;
	int64_t text_len;
	uint64_t content_hash;       /* identifies the corpus in a checkpoint */
	double floor_nats;           /* conditional entropy of next given current */
};

/* Where a rank's stream stands: enough to continue it bit for bit. */
struct rmoe_corpus_state {
	uint64_t counter;            /* draws taken so far */
	int64_t token;               /* current token of the walk (Markov) */
};

/* A chain with `branching` successors per token (one of them i+1 mod V, so
 * the chain is irreducible), weights drawn from seed. 0 or RMOE_EINVAL /
 * RMOE_ENOMEM with msg filled. */
int rmoe_corpus_markov(struct rmoe_corpus *c, int64_t vocab, int64_t branching, uint64_t seed,
                       char *msg, size_t msglen);

/* The bytes of path, V = 256. min_len: the file must hold at least this many
 * bytes. 0 or RMOE_EIO / RMOE_EINVAL with msg naming the file. */
int rmoe_corpus_text(struct rmoe_corpus *c, const char *path, int64_t min_len, uint64_t seed,
                     char *msg, size_t msglen);

void rmoe_corpus_free(struct rmoe_corpus *c);

/* The start of rank's stream. */
void rmoe_corpus_start(const struct rmoe_corpus *c, int rank, struct rmoe_corpus_state *s);

/* The next tokens+1 tokens of rank's stream into seq: inputs seq[0..T) and
 * next-token targets seq[1..T]. The Markov walk continues where the last
 * call stopped (seq[0] is the previous call's last token). */
void rmoe_corpus_next(const struct rmoe_corpus *c, int rank, struct rmoe_corpus_state *s,
                      int64_t tokens, int32_t *seq);

#endif
