/* Per-rank checkpoint files: header, payload, checksum trailer.
 *
 *   header (128 bytes): "RMOECKPT", u32 version, u32 header bytes, u64 byte
 *     order mark, u64 configuration hash, i32 rank, i32 rank count, i64 step,
 *     i64 payload bytes, i64 replicated count, i64 expert count, i64 records
 *   payload: identity (8 bytes a field), data state, loss history (step,
 *     loss, aux loss, gradient norm, learning rate: the deterministic fields,
 *     so a checkpoint depends on the configuration and the step only),
 *     replicated and expert parameters, then the AdamW moments m, v of each
 *   trailer: u64 FNV-1a of header and payload
 *
 * Native byte order; the mark refuses a file from a machine of the other. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <mpi.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "messages.h"
#include "rmoe_scheduler.h"
#include "rmoe_system.h"

#define HEADER_BYTES 128
#define ORDER_MARK 0x0102030405060708ULL
#define FNV_BASIS 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL
#define RECORD_BYTES (5 * 8)

static const char magic[8] = {'R', 'M', 'O', 'E', 'C', 'K', 'P', 'T'};

enum field_kind { F_INT, F_HASH, F_REAL, F_DISPATCH, F_CORPUS };

static const struct field {
	const char *name;
	enum field_kind kind;
	size_t offset;
} fields[] = {
	{"--layers", F_INT, offsetof(struct rmoe_ckpt_identity, layers)},
	{"--hidden", F_INT, offsetof(struct rmoe_ckpt_identity, hidden)},
	{"--ffn", F_INT, offsetof(struct rmoe_ckpt_identity, ffn)},
	{"--experts", F_INT, offsetof(struct rmoe_ckpt_identity, experts)},
	{"--topk", F_INT, offsetof(struct rmoe_ckpt_identity, topk)},
	{"--vocab", F_INT, offsetof(struct rmoe_ckpt_identity, vocab)},
	{"--tokens", F_INT, offsetof(struct rmoe_ckpt_identity, tokens)},
	{"--shared-ffn", F_INT, offsetof(struct rmoe_ckpt_identity, shared_ffn)},
	{"--seed", F_INT, offsetof(struct rmoe_ckpt_identity, seed)},
	{"--dispatch", F_DISPATCH, offsetof(struct rmoe_ckpt_identity, dispatch)},
	{"corpus", F_CORPUS, offsetof(struct rmoe_ckpt_identity, corpus_kind)},
	{"--branching", F_INT, offsetof(struct rmoe_ckpt_identity, branching)},
	{"--warmup", F_INT, offsetof(struct rmoe_ckpt_identity, warmup)},
	{"corpus content hash", F_HASH, offsetof(struct rmoe_ckpt_identity, corpus_hash)},
	{"--lr", F_REAL, offsetof(struct rmoe_ckpt_identity, lr)},
	{"beta1", F_REAL, offsetof(struct rmoe_ckpt_identity, beta1)},
	{"beta2", F_REAL, offsetof(struct rmoe_ckpt_identity, beta2)},
	{"eps", F_REAL, offsetof(struct rmoe_ckpt_identity, eps)},
	{"--weight-decay", F_REAL, offsetof(struct rmoe_ckpt_identity, weight_decay)},
	{"--clip", F_REAL, offsetof(struct rmoe_ckpt_identity, clip)},
	{"--aux-weight", F_REAL, offsetof(struct rmoe_ckpt_identity, aux_weight)},
};
#define NFIELDS (sizeof(fields) / sizeof(fields[0]))

static uint64_t fnv(uint64_t h, const void *buf, size_t n)
{
	const unsigned char *p = buf;
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * FNV_PRIME;
	return h;
}

uint64_t rmoe_ckpt_identity_hash(const struct rmoe_ckpt_identity *id)
{
	uint64_t h = FNV_BASIS;
	for (size_t i = 0; i < NFIELDS; i++)
		h = fnv(h, (const char *)id + fields[i].offset, 8);
	return h;
}

void rmoe_ckpt_path(const char *dir, int rank, char *path, size_t len)
{
	snprintf(path, len, "%s/rank-%05d.ckpt", dir, rank);
}

/* ---- writing ------------------------------------------------------------ */

struct sink {
	FILE *f;
	uint64_t hash;
	int failed;
};

static void put(struct sink *s, const void *buf, size_t n)
{
	if (s->failed || n == 0)
		return;
	s->hash = fnv(s->hash, buf, n);
	if (fwrite(buf, 1, n, s->f) != n)
		s->failed = errno ? errno : EIO;
}

static void put64(struct sink *s, const void *v)
{
	put(s, v, 8);
}

static int64_t payload_bytes(int64_t records, int64_t rep_n, int64_t exp_n)
{
	return (int64_t)NFIELDS * 8 + 16 + records * RECORD_BYTES + 3 * (rep_n + exp_n) * 4;
}

int rmoe_ckpt_write_local(const char *dir, int rank, int nranks, const struct rmoe_ckpt_identity *id,
                          const struct rmoe_ckpt_state *st, const struct rmoe_train_model *m,
                          const struct rmoe_adamw *o, char *tmp, size_t tmplen, char *msg, size_t msglen)
{
	tmp[0] = '\0';
	int err = rmoe_mkdir_p(dir);
	if (err) {
		snprintf(msg, msglen, "--checkpoint-dir %s: cannot create the directory (%s)", dir, strerror(err));
		return RMOE_EIO;
	}
	snprintf(tmp, tmplen, "%s/.rank-%05d.ckpt.tmp.%ld", dir, rank, (long)getpid());
	struct sink s = {fopen(tmp, "wb"), FNV_BASIS, 0};
	if (!s.f) {
		snprintf(msg, msglen, "%s: cannot create (%s)", tmp, strerror(errno));
		tmp[0] = '\0';
		return RMOE_EIO;
	}
	unsigned char header[HEADER_BYTES] = {0};
	const uint32_t version = RMOE_CKPT_VERSION, hbytes = HEADER_BYTES;
	const uint64_t mark = ORDER_MARK, hash = rmoe_ckpt_identity_hash(id);
	const int32_t r32 = rank, n32 = nranks;
	const int64_t pbytes = payload_bytes(st->step, m->rep_n, m->exp_n);
	memcpy(header, magic, 8);
	memcpy(header + 8, &version, 4);
	memcpy(header + 12, &hbytes, 4);
	memcpy(header + 16, &mark, 8);
	memcpy(header + 24, &hash, 8);
	memcpy(header + 32, &r32, 4);
	memcpy(header + 36, &n32, 4);
	memcpy(header + 40, &st->step, 8);
	memcpy(header + 48, &pbytes, 8);
	memcpy(header + 56, &m->rep_n, 8);
	memcpy(header + 64, &m->exp_n, 8);
	memcpy(header + 72, &st->step, 8);
	put(&s, header, HEADER_BYTES);
	for (size_t i = 0; i < NFIELDS; i++)
		put64(&s, (const char *)id + fields[i].offset);
	put64(&s, &st->data.counter);
	put64(&s, &st->data.token);
	for (int64_t i = 0; i < st->step; i++) {
		const struct rmoe_train_record *r = &st->history[i];
		const void *v[5] = {&r->step, &r->loss, &r->aux, &r->grad_norm, &r->lr};
		for (int k = 0; k < 5; k++)
			put64(&s, v[k]);
	}
	put(&s, m->rep_w, (size_t)m->rep_n * sizeof(float));
	put(&s, m->exp_w, (size_t)m->exp_n * sizeof(float));
	put(&s, o->m_rep, (size_t)m->rep_n * sizeof(float));
	put(&s, o->v_rep, (size_t)m->rep_n * sizeof(float));
	put(&s, o->m_exp, (size_t)m->exp_n * sizeof(float));
	put(&s, o->v_exp, (size_t)m->exp_n * sizeof(float));
	uint64_t sum = s.hash;
	if (!s.failed && fwrite(&sum, 1, 8, s.f) != 8)
		s.failed = errno ? errno : EIO;
	if (!s.failed && fflush(s.f) != 0)
		s.failed = errno;
	/* Data on disk before the rename makes it visible under the final name. */
	if (!s.failed && fsync(fileno(s.f)) != 0)
		s.failed = errno;
	if (fclose(s.f) != 0 && !s.failed)
		s.failed = errno;
	if (s.failed) {
		snprintf(msg, msglen, "%s: write failed (%s)", tmp, strerror(s.failed));
		unlink(tmp);
		tmp[0] = '\0';
		return RMOE_EIO;
	}
	return 0;
}

/* ---- reading ------------------------------------------------------------ */

static void describe(const struct field *f, const void *v, char *buf, size_t len)
{
	int64_t i;
	double d;
	memcpy(&i, v, 8);
	memcpy(&d, v, 8);
	switch (f->kind) {
	case F_INT: snprintf(buf, len, "%lld", (long long)i); break;
	case F_HASH: snprintf(buf, len, "%016llx", (unsigned long long)i); break;
	case F_REAL: snprintf(buf, len, "%.17g", d); break;
	case F_DISPATCH: snprintf(buf, len, "%s", rmoe_dispatch_name((enum rmoe_dispatch)i)); break;
	case F_CORPUS: snprintf(buf, len, "%s", i == RMOE_CORPUS_TEXT ? "--text" : "Markov chain"); break;
	}
}

/* Lists the fields where the file's identity differs from this run's. */
static int compare_identity(const unsigned char *stored, const struct rmoe_ckpt_identity *id, char *out,
                            size_t len)
{
	int n = 0;
	size_t used = 0;
	out[0] = '\0';
	for (size_t i = 0; i < NFIELDS; i++) {
		const void *mine = (const char *)id + fields[i].offset;
		const void *theirs = stored + i * 8;
		if (memcmp(mine, theirs, 8) == 0)
			continue;
		char a[64], b[64];
		describe(&fields[i], theirs, a, sizeof(a));
		describe(&fields[i], mine, b, sizeof(b));
		if (used < len)
			used += (size_t)snprintf(out + used, len - used, "%s%s %s in the checkpoint, %s in this run",
			                         n ? "; " : "", fields[i].name, a, b);
		n++;
	}
	return n;
}

/* The header's fixed fields, as stored. */
struct header {
	uint32_t version, hbytes;
	uint64_t mark, hash;
	int32_t rank, nranks;
	int64_t step, pbytes, rep_n, exp_n, records;
};

/* Whether buf is a whole, undamaged checkpoint of this format: magic,
 * byte order, version, a sane header, the size it gives and the checksum,
 * in that order; its header into *h. */
static int check_file(const char *path, const unsigned char *buf, int64_t size, struct header *h, char *msg,
                      size_t msglen)
{
	if (size < HEADER_BYTES + 8) {
		snprintf(msg, msglen, "%s: truncated: %lld bytes, shorter than the %d-byte header and trailer",
		         path, (long long)size, HEADER_BYTES + 8);
		return RMOE_EFORMAT;
	}
	if (memcmp(buf, magic, 8) != 0) {
		snprintf(msg, msglen, "%s: not a relaymoe checkpoint (no RMOECKPT magic)", path);
		return RMOE_EFORMAT;
	}
	memcpy(&h->version, buf + 8, 4);
	memcpy(&h->hbytes, buf + 12, 4);
	memcpy(&h->mark, buf + 16, 8);
	memcpy(&h->hash, buf + 24, 8);
	memcpy(&h->rank, buf + 32, 4);
	memcpy(&h->nranks, buf + 36, 4);
	memcpy(&h->step, buf + 40, 8);
	memcpy(&h->pbytes, buf + 48, 8);
	memcpy(&h->rep_n, buf + 56, 8);
	memcpy(&h->exp_n, buf + 64, 8);
	memcpy(&h->records, buf + 72, 8);
	if (h->mark != ORDER_MARK) {
		snprintf(msg, msglen, "%s: written on a machine of the other byte order", path);
		return RMOE_EFORMAT;
	}
	if (h->version != RMOE_CKPT_VERSION || h->hbytes != HEADER_BYTES) {
		snprintf(msg, msglen, "%s: format version %u (header %u bytes): expected version %d", path,
		         h->version, h->hbytes, RMOE_CKPT_VERSION);
		return RMOE_EFORMAT;
	}
	/* Bounded before any arithmetic: a damaged header must not overflow. */
	const int64_t limit = (int64_t)1 << 40;
	if (h->pbytes < 0 || h->step < 0 || h->records != h->step || h->rep_n < 0 || h->exp_n < 0 ||
	    h->records > limit || h->rep_n > limit || h->exp_n > limit ||
	    h->pbytes != payload_bytes(h->records, h->rep_n, h->exp_n)) {
		snprintf(msg, msglen, "%s: corrupted header (step %lld, payload %lld bytes)", path,
		         (long long)h->step, (long long)h->pbytes);
		return RMOE_EFORMAT;
	}
	const int64_t expect = HEADER_BYTES + h->pbytes + 8;
	if (size != expect) {
		snprintf(msg, msglen, "%s: %s: %lld bytes, expected %lld", path,
		         size < expect ? "truncated" : "trailing data after the checkpoint", (long long)size,
		         (long long)expect);
		return RMOE_EFORMAT;
	}
	uint64_t stored, computed = fnv(FNV_BASIS, buf, (size_t)(size - 8));
	memcpy(&stored, buf + size - 8, 8);
	if (stored != computed) {
		snprintf(msg, msglen, "%s: corrupted: checksum %016llx does not match the stored %016llx", path,
		         (unsigned long long)computed, (unsigned long long)stored);
		return RMOE_EFORMAT;
	}
	return 0;
}

/* Whether the checkpoint is this rank's of this run: written by the same
 * rank of as many, by the same configuration, for a model of this size. */
static int check_owner(const char *path, const unsigned char *buf, const struct header *h, int rank, int nranks,
                       const struct rmoe_ckpt_identity *id, const struct rmoe_train_model *m, char *msg,
                       size_t msglen)
{
	if (h->nranks != nranks || h->rank != rank) {
		snprintf(msg, msglen, "%s: written by rank %d of a run of %d ranks; this is rank %d of %d", path,
		         h->rank, h->nranks, rank, nranks);
		return RMOE_EMISMATCH;
	}
	char diff[1024];
	if (compare_identity(buf + HEADER_BYTES, id, diff, sizeof(diff)) > 0 ||
	    h->hash != rmoe_ckpt_identity_hash(id)) {
		snprintf(msg, msglen, "%s: written by another configuration: %s", path,
		         diff[0] ? diff : "configuration hash differs");
		return RMOE_EMISMATCH;
	}
	if (h->rep_n != m->rep_n || h->exp_n != m->exp_n) {
		snprintf(msg, msglen, "%s: holds %lld replicated and %lld expert parameters, this model has %lld "
		         "and %lld", path, (long long)h->rep_n, (long long)h->exp_n, (long long)m->rep_n,
		         (long long)m->exp_n);
		return RMOE_EMISMATCH;
	}
	return 0;
}

/* The checkpoint in buf, checked, into st (its history allocated here), m
 * and o. */
static int check_and_load(const char *path, const unsigned char *buf, int64_t size, int rank, int nranks,
                          const struct rmoe_ckpt_identity *id, struct rmoe_ckpt_state *st,
                          struct rmoe_train_model *m, struct rmoe_adamw *o, char *msg, size_t msglen)
{
	struct header h;
	int rc = check_file(path, buf, size, &h, msg, msglen);
	if (!rc)
		rc = check_owner(path, buf, &h, rank, nranks, id, m, msg, msglen);
	if (rc)
		return rc;
	const int64_t step = h.step;
	struct rmoe_train_record *history = calloc((size_t)(step > 0 ? step : 1), sizeof(*history));
	if (!history) {
		snprintf(msg, msglen, "%s: out of host memory for %lld history records", path, (long long)step);
		return RMOE_ENOMEM;
	}
	const unsigned char *p = buf + HEADER_BYTES + NFIELDS * 8;
	st->step = step;
	memcpy(&st->data.counter, p, 8);
	memcpy(&st->data.token, p + 8, 8);
	p += 16;
	for (int64_t i = 0; i < step; i++, p += RECORD_BYTES) {
		struct rmoe_train_record *r = &history[i];
		void *v[5] = {&r->step, &r->loss, &r->aux, &r->grad_norm, &r->lr};
		for (int k = 0; k < 5; k++)
			memcpy(v[k], p + 8 * k, 8);
		/* Timings and memory belonged to the process that ran the step. */
		r->seconds = r->tokens_per_s = NAN;
		r->peak_layer_bytes = r->peak_rss_bytes = -1;
	}
	st->history = history;
	float *dst[6] = {m->rep_w, m->exp_w, o->m_rep, o->v_rep, o->m_exp, o->v_exp};
	int64_t cnt[6] = {h.rep_n, h.exp_n, h.rep_n, h.rep_n, h.exp_n, h.exp_n};
	for (int k = 0; k < 6; k++) {
		memcpy(dst[k], p, (size_t)cnt[k] * sizeof(float));
		p += cnt[k] * (int64_t)sizeof(float);
	}
	return 0;
}

int rmoe_ckpt_read_local(const char *dir, int rank, int nranks, const struct rmoe_ckpt_identity *id,
                         struct rmoe_ckpt_state *st, struct rmoe_train_model *m, struct rmoe_adamw *o,
                         char *msg, size_t msglen)
{
	char path[4096];
	rmoe_ckpt_path(dir, rank, path, sizeof(path));
	st->history = NULL;
	FILE *f = fopen(path, "rb");
	if (!f) {
		if (errno == ENOENT)
			snprintf(msg, msglen, "%s: missing: no checkpoint of rank %d in %s", path, rank, dir);
		else
			snprintf(msg, msglen, "%s: cannot open (%s)", path, strerror(errno));
		return RMOE_EIO;
	}
	struct stat sb;
	if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
		snprintf(msg, msglen, "%s: not a regular file", path);
		fclose(f);
		return RMOE_EIO;
	}
	int64_t size = (int64_t)sb.st_size;
	unsigned char *buf = malloc((size_t)(size > 0 ? size : 1));
	if (!buf) {
		snprintf(msg, msglen, "%s: out of host memory for %lld bytes", path, (long long)size);
		fclose(f);
		return RMOE_ENOMEM;
	}
	size_t got = fread(buf, 1, (size_t)size, f);
	int bad = ferror(f);
	fclose(f);
	int rc;
	if (bad || (int64_t)got != size) {
		snprintf(msg, msglen, "%s: read error after %zu of %lld bytes", path, got, (long long)size);
		rc = RMOE_EIO;
	} else {
		rc = check_and_load(path, buf, size, rank, nranks, id, st, m, o, msg, msglen);
	}
	free(buf);
	return rc;
}

/* ---- collective --------------------------------------------------------- */

/* Every rank learns whether any failed and prints the first failing rank's
 * message (naming its file), so no rank stops silently and none waits. */
static int agree_report(int rc, const char *what, char *msg, size_t msglen)
{
	int nranks, rank;
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	int *all = malloc((size_t)nranks * sizeof(int));
	if (!all)
		return rmoe_app_agree(rc ? rc : 0);
	MPI_Allgather(&rc, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD);
	int first = -1, failed = 0, worst = 0;
	for (int r = 0; r < nranks; r++)
		if (all[r]) {
			failed++;
			if (first < 0)
				first = r;
			worst = all[r] < worst ? all[r] : worst;
		}
	free(all);
	if (first < 0)
		return 0;
	MPI_Bcast(msg, (int)msglen, MPI_CHAR, first, MPI_COMM_WORLD);
	msg[msglen - 1] = '\0';
	if (failed > 1)
		rmoe_app_error("%s: %s (and %d other rank(s) failed)", what, msg, failed - 1);
	else
		rmoe_app_error("%s: %s", what, msg);
	return worst;
}

static void sync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
}

int rmoe_ckpt_save(const char *dir, const struct rmoe_ckpt_identity *id, const struct rmoe_ckpt_state *st,
                   const struct rmoe_train_model *m, const struct rmoe_adamw *o)
{
	char tmp[4096], path[4096], msg[8448] = "";
	int rc = rmoe_ckpt_write_local(dir, m->rank, m->nranks, id, st, m, o, tmp, sizeof(tmp), msg,
	                               sizeof(msg));
	rc = agree_report(rc, "cannot save the checkpoint", msg, sizeof(msg));
	if (rc) {
		if (tmp[0])
			unlink(tmp);
		return rc;
	}
	rmoe_ckpt_path(dir, m->rank, path, sizeof(path));
	if (rename(tmp, path) != 0) {
		snprintf(msg, sizeof(msg), "%s: cannot rename to %s (%s)", tmp, path, strerror(errno));
		unlink(tmp);
		rc = RMOE_EIO;
	} else {
		sync_dir(dir);
	}
	return agree_report(rc, "cannot save the checkpoint", msg, sizeof(msg));
}

int rmoe_ckpt_load(const char *dir, const struct rmoe_ckpt_identity *id, struct rmoe_ckpt_state *st,
                   struct rmoe_train_model *m, struct rmoe_adamw *o)
{
	char msg[8448] = "";
	int rc = rmoe_ckpt_read_local(dir, m->rank, m->nranks, id, st, m, o, msg, sizeof(msg));
	rc = agree_report(rc, "cannot resume", msg, sizeof(msg));
	if (rc)
		return rc;
	int64_t lo = st->step, hi = st->step;
	MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
	MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
	if (lo != hi) {
		rmoe_app_error("cannot resume: the checkpoints in %s are of different steps (%lld to %lld): a save "
		               "was interrupted between renames", dir, (long long)lo, (long long)hi);
		return RMOE_EMISMATCH;
	}
	return 0;
}
