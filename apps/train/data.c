/* Seeded corpora for `relaymoe train`: every draw is a pure function of
 * (seed, stream, counter) (apps/support/seeded.h), so a stream continues
 * bit for bit from its saved counter. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "relaymoe/relaymoe.h"
#include "seeded.h"

/* Streams of the corpus, apart from those of the layer tensors and of the
 * model's parameters (model.c). */
#define STREAM_CHAIN ((uint64_t)RMOE_STREAM_USER + 1)
#define STREAM_DATA ((uint64_t)RMOE_STREAM_USER + 0x100000)

static double unit(uint64_t seed, uint64_t stream, uint64_t index)
{
	return (double)(rmoe_seeded_u64(seed, stream, index) >> 11) * 0x1p-53;
}

/* Stationary distribution of the lazy chain (I + P)/2: the same as P's, and
 * the lazy chain is aperiodic, so the power iteration converges. */
static int stationary(const struct rmoe_corpus *c, double *pi)
{
	const int64_t V = c->vocab, B = c->branching;
	double *next = malloc((size_t)V * sizeof(double));
	if (!next)
		return RMOE_ENOMEM;
	for (int64_t i = 0; i < V; i++)
		pi[i] = 1.0 / (double)V;
	for (int it = 0; it < 200000; it++) {
		for (int64_t i = 0; i < V; i++)
			next[i] = 0.5 * pi[i];
		for (int64_t i = 0; i < V; i++) {
			double prev = 0.0;
			for (int64_t b = 0; b < B; b++) {
				next[c->succ[i * B + b]] += 0.5 * pi[i] * (c->cum[i * B + b] - prev);
				prev = c->cum[i * B + b];
			}
		}
		double change = 0.0;
		for (int64_t i = 0; i < V; i++) {
			change += fabs(next[i] - pi[i]);
			pi[i] = next[i];
		}
		if (change < 1e-14)
			break;
	}
	free(next);
	return 0;
}

/* The chain of c (vocab, branching and seed set): each token's successors,
 * token i + 1 (mod V) first and B - 1 others drawn without repeats, and
 * their cumulative probabilities. */
static void draw_chain(struct rmoe_corpus *c)
{
	const int64_t V = c->vocab, B = c->branching;
	const uint64_t seed = c->seed;
	uint64_t draw = 0;
	for (int64_t i = 0; i < V; i++) {
		int32_t *s = c->succ + i * B;
		double *w = c->cum + i * B;
		s[0] = (int32_t)((i + 1) % V);
		for (int64_t b = 1; b < B; b++) {
			int fresh;
			do {
				s[b] = (int32_t)(rmoe_seeded_u64(seed, STREAM_CHAIN, draw++) % (uint64_t)V);
				fresh = 1;
				for (int64_t q = 0; q < b; q++)
					fresh &= s[q] != s[b];
			} while (!fresh);
		}
		/* Cubed uniform weights: skewed rows, so the entropy rate sits
		 * well below ln(branching) and the model has structure to learn. */
		double total = 0.0;
		for (int64_t b = 0; b < B; b++) {
			double u = 0.05 + 0.95 * unit(seed, STREAM_CHAIN, draw++);
			w[b] = u * u * u;
			total += w[b];
		}
		double run = 0.0;
		for (int64_t b = 0; b < B; b++) {
			run += w[b] / total;
			w[b] = run;
		}
		w[B - 1] = 1.0;
	}
}

/* The chain's entropy rate, nats per token, from its stationary
 * distribution pi: the loss floor a model of the next token can reach. */
static double entropy_rate(const struct rmoe_corpus *c, const double *pi)
{
	const int64_t V = c->vocab, B = c->branching;
	double h = 0.0;
	for (int64_t i = 0; i < V; i++) {
		double prev = 0.0, hi = 0.0;
		for (int64_t b = 0; b < B; b++) {
			double p = c->cum[i * B + b] - prev;
			prev = c->cum[i * B + b];
			if (p > 0.0)
				hi -= p * log(p);
		}
		h += pi[i] * hi;
	}
	return h;
}

int rmoe_corpus_markov(struct rmoe_corpus *c, int64_t vocab, int64_t branching, uint64_t seed,
                       char *msg, size_t msglen)
{
	memset(c, 0, sizeof(*c));
	if (vocab < 2 || branching < 1 || branching > vocab) {
		snprintf(msg, msglen, "--branching %lld with --vocab %lld: expected 1 <= branching <= vocab "
		         "and vocab >= 2", (long long)branching, (long long)vocab);
		return RMOE_EINVAL;
	}
	c->kind = RMOE_CORPUS_MARKOV;
	c->vocab = vocab;
	c->branching = branching;
	c->seed = seed;
	const int64_t V = vocab, B = branching;
	c->succ = malloc((size_t)(V * B) * sizeof(int32_t));
	c->cum = malloc((size_t)(V * B) * sizeof(double));
	double *pi = malloc((size_t)V * sizeof(double));
	if (!c->succ || !c->cum || !pi) {
		free(pi);
		rmoe_corpus_free(c);
		snprintf(msg, msglen, "out of host memory for a chain of %lld x %lld transitions",
		         (long long)V, (long long)B);
		return RMOE_ENOMEM;
	}
	draw_chain(c);
	if (stationary(c, pi)) {
		free(pi);
		rmoe_corpus_free(c);
		snprintf(msg, msglen, "out of host memory for the chain's stationary distribution");
		return RMOE_ENOMEM;
	}
	c->floor_nats = entropy_rate(c, pi);
	free(pi);
	/* FNV-1a over the definition: a checkpoint of another chain is refused. */
	uint64_t hash = 0xcbf29ce484222325ULL;
	const int64_t words[3] = {V, B, (int64_t)seed};
	const unsigned char *p = (const unsigned char *)words;
	for (size_t k = 0; k < sizeof(words); k++)
		hash = (hash ^ p[k]) * 0x100000001b3ULL;
	c->content_hash = hash;
	return 0;
}

int rmoe_corpus_text(struct rmoe_corpus *c, const char *path, int64_t min_len, uint64_t seed,
                     char *msg, size_t msglen)
{
	memset(c, 0, sizeof(*c));
	c->kind = RMOE_CORPUS_TEXT;
	c->vocab = 256;
	c->seed = seed;
	FILE *f = fopen(path, "rb");
	if (!f) {
		snprintf(msg, msglen, "--text %s: cannot open (%s)", path, strerror(errno));
		return RMOE_EIO;
	}
	int64_t cap = 1 << 16, len = 0;
	unsigned char *buf = malloc((size_t)cap);
	while (buf) {
		size_t got = fread(buf + len, 1, (size_t)(cap - len), f);
		len += (int64_t)got;
		if (len < cap)
			break;
		cap *= 2;
		unsigned char *grown = realloc(buf, (size_t)cap);
		if (!grown)
			free(buf);
		buf = grown;
	}
	int bad = ferror(f);
	fclose(f);
	if (!buf || bad) {
		free(buf);
		snprintf(msg, msglen, "--text %s: %s", path, bad ? "read error" : "out of host memory");
		return buf ? RMOE_EIO : RMOE_ENOMEM;
	}
	if (len < min_len) {
		free(buf);
		snprintf(msg, msglen, "--text %s holds %lld bytes: expected at least %lld (--tokens + 1)", path,
		         (long long)len, (long long)min_len);
		return RMOE_EINVAL;
	}
	c->text = buf;
	c->text_len = len;
	uint64_t hash = 0xcbf29ce484222325ULL;
	for (int64_t i = 0; i < len; i++)
		hash = (hash ^ buf[i]) * 0x100000001b3ULL;
	c->content_hash = hash;

	double *count = calloc(256 * 256, sizeof(double));
	if (!count) {
		rmoe_corpus_free(c);
		snprintf(msg, msglen, "out of host memory for the bigram counts of %s", path);
		return RMOE_ENOMEM;
	}
	for (int64_t i = 0; i + 1 < len; i++)
		count[buf[i] * 256 + buf[i + 1]] += 1.0;
	double h = 0.0, pairs = (double)(len - 1);
	for (int a = 0; a < 256; a++) {
		double row = 0.0;
		for (int b = 0; b < 256; b++)
			row += count[a * 256 + b];
		for (int b = 0; b < 256; b++)
			if (count[a * 256 + b] > 0.0)
				h -= count[a * 256 + b] / pairs * log(count[a * 256 + b] / row);
	}
	free(count);
	c->floor_nats = h;
	return 0;
}

void rmoe_corpus_free(struct rmoe_corpus *c)
{
	free(c->succ);
	free(c->cum);
	free(c->text);
	*c = (struct rmoe_corpus){0};
}

void rmoe_corpus_start(const struct rmoe_corpus *c, int rank, struct rmoe_corpus_state *s)
{
	s->counter = 0;
	s->token = 0;
	if (c->kind == RMOE_CORPUS_MARKOV)
		s->token = (int64_t)(rmoe_seeded_u64(c->seed, STREAM_DATA + (uint64_t)rank, s->counter++) %
		                     (uint64_t)c->vocab);
}

void rmoe_corpus_next(const struct rmoe_corpus *c, int rank, struct rmoe_corpus_state *s,
                      int64_t tokens, int32_t *seq)
{
	const uint64_t stream = STREAM_DATA + (uint64_t)rank;
	if (c->kind == RMOE_CORPUS_TEXT) {
		/* A window of tokens+1 bytes at a seeded offset. */
		uint64_t span = (uint64_t)(c->text_len - tokens);
		int64_t off = (int64_t)(rmoe_seeded_u64(c->seed, stream, s->counter++) % span);
		for (int64_t i = 0; i <= tokens; i++)
			seq[i] = c->text[off + i];
		return;
	}
	const int64_t B = c->branching;
	seq[0] = (int32_t)s->token;
	for (int64_t i = 1; i <= tokens; i++) {
		double u = unit(c->seed, stream, s->counter++);
		const double *cum = c->cum + s->token * B;
		int64_t b = 0;
		while (b < B - 1 && u >= cum[b])
			b++;
		s->token = c->succ[s->token * B + b];
		seq[i] = (int32_t)s->token;
	}
}
