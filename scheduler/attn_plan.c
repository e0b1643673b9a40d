/* Selective attention recomputation planner (paper §3.4).
 *
 * Sizes per device, for micro-batch b, sequence S, TP, CP, SP and GQA with h
 * query and g KV heads of dimension d, hidden H, e bytes per element:
 *   s = S/CP query tokens; h' = h/TP heads; g' = g/TP KV heads (one when
 *   g < TP: KV heads are replicated); s_n = s/TP tokens in the norm regions
 *   under SP, s without.
 *   O     b s h' d e        LSE  b h' s 4 (fp32)     (FlashAttention saves both)
 *   QKV   b s (h' + 2g') d e
 *   norm output (the QKV projection's input) b s_n H e
 *   layer input (the checkpoint of full recomputation) b s_n H e
 * FLOPs per device (a multiply-add is 2):
 *   core forward  4 b s h' d a, a the keys a query sees on average: S/2
 *                 causal, w - w^2/(2S) with a sliding window w < S
 *   QKV           2 b s H (h' + 2g') d       output projection 2 b s h' d H
 *   RMSNorm       4 b s_n H
 * Backward costs twice the forward GEMMs and 2.5 times the attention kernel's
 * forward (FlashAttention-2 recomputes P inside its backward); full
 * recomputation replays norm, QKV and the core forward. The throughput
 * estimate assumes the step runs at one FLOP rate, so the time it saves is
 * the share of FLOPs it no longer recomputes. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "rmoe_attn_plan.h"
#include "rmoe_scheduler.h"

static const char *keep_names[RMOE_ATTN_NKEEP] = {"recompute", "keep-core", "keep-qkv", "keep-all"};
static const char *keep_adds[RMOE_ATTN_NKEEP] = {"", "O + logsumexp", "+ Q, K, V",
                                                 "+ norm output"};

const char *rmoe_attn_keep_name(int level)
{
	return level >= 0 && level < RMOE_ATTN_NKEEP ? keep_names[level] : "unknown";
}

static int check_input(const struct rmoe_attn_plan_input *in)
{
	if (!in)
		return rmoe_error(RMOE_EINVAL, "attention plan: input is NULL");
	const struct {
		const char *name;
		int64_t v;
	} pos[] = {{"layers", in->layers}, {"heads", in->heads}, {"kv_heads", in->kv_heads},
	           {"head_dim", in->head_dim}, {"hidden", in->hidden}, {"seq_len", in->seq_len},
	           {"micro_batch", in->micro_batch}, {"tp", in->tp}, {"cp", in->cp}, {"ep", in->ep},
	           {"device_bytes", in->device_bytes}};
	for (size_t i = 0; i < sizeof(pos) / sizeof(pos[0]); i++)
		if (pos[i].v <= 0)
			return rmoe_error(RMOE_EINVAL, "attention plan: %s = %lld, expected a positive integer",
			                  pos[i].name, (long long)pos[i].v);
	if (in->layers > RMOE_ATTN_MAX_LAYERS)
		return rmoe_error(RMOE_EINVAL, "attention plan: layers = %lld, expected at most %d",
		                  (long long)in->layers, RMOE_ATTN_MAX_LAYERS);
	if (in->heads % in->kv_heads)
		return rmoe_error(RMOE_EINVAL, "attention plan: heads = %lld not a multiple of kv_heads = %lld",
		                  (long long)in->heads, (long long)in->kv_heads);
	if (in->heads % in->tp)
		return rmoe_error(RMOE_EINVAL, "attention plan: heads = %lld not divisible by tp = %lld",
		                  (long long)in->heads, (long long)in->tp);
	if (in->kv_heads >= in->tp ? in->kv_heads % in->tp : in->tp % in->kv_heads)
		return rmoe_error(RMOE_EINVAL, "attention plan: kv_heads = %lld and tp = %lld: expected one to "
		                  "divide the other", (long long)in->kv_heads, (long long)in->tp);
	if (in->seq_len % in->cp)
		return rmoe_error(RMOE_EINVAL, "attention plan: seq_len = %lld not divisible by cp = %lld",
		                  (long long)in->seq_len, (long long)in->cp);
	if (in->sp != 0 && in->sp != 1)
		return rmoe_error(RMOE_EINVAL, "attention plan: sp = %d, expected 0 or 1", in->sp);
	if (in->sp && (in->seq_len / in->cp) % in->tp)
		return rmoe_error(RMOE_EINVAL, "attention plan: with sp, seq_len / cp = %lld must be divisible "
		                  "by tp = %lld", (long long)(in->seq_len / in->cp), (long long)in->tp);
	if (in->dtype_bytes != 2 && in->dtype_bytes != 4)
		return rmoe_error(RMOE_EINVAL, "attention plan: dtype_bytes = %d, expected 2 or 4", in->dtype_bytes);
	const struct {
		const char *name;
		int64_t v;
	} nonneg[] = {{"model_state_bytes", in->model_state_bytes}, {"moe_peak_bytes", in->moe_peak_bytes},
	              {"other_activation_bytes", in->other_activation_bytes}, {"moe_ffn", in->moe_ffn},
	              {"moe_topk", in->moe_topk}, {"moe_shared_ffn", in->moe_shared_ffn}};
	for (size_t i = 0; i < sizeof(nonneg) / sizeof(nonneg[0]); i++)
		if (nonneg[i].v < 0)
			return rmoe_error(RMOE_EINVAL, "attention plan: %s = %lld, expected 0 or more",
			                  nonneg[i].name, (long long)nonneg[i].v);
	if (in->moe_ffn > 0 && in->moe_topk < 1)
		return rmoe_error(RMOE_EINVAL, "attention plan: moe_ffn = %lld needs moe_topk >= 1",
		                  (long long)in->moe_ffn);
	for (int64_t l = 0; in->window && l < in->layers; l++)
		if (in->window[l] < 0)
			return rmoe_error(RMOE_EINVAL, "attention plan: window[%lld] = %lld, expected 0 (full) or a "
			                  "positive token count", (long long)l, (long long)in->window[l]);
	return 0;
}

static int64_t local_kv(const struct rmoe_attn_plan_input *in)
{
	return in->kv_heads >= in->tp ? in->kv_heads / in->tp : 1;
}

static int64_t norm_tokens(const struct rmoe_attn_plan_input *in)
{
	int64_t s = in->seq_len / in->cp;
	return in->sp ? s / in->tp : s;
}

/* The costs of a layer of a checked input. */
static void layer_cost(const struct rmoe_attn_plan_input *in, int64_t layer, struct rmoe_attn_layer_cost *c)
{
	const int64_t b = in->micro_batch, S = in->seq_len, s = S / in->cp, h = in->heads / in->tp,
	              g = local_kv(in), d = in->head_dim, H = in->hidden, e = in->dtype_bytes,
	              sn = norm_tokens(in);
	const int64_t w = in->window ? in->window[layer] : 0;
	const double seen = (w == 0 || w >= S) ? (double)S / 2.0 : (double)w - (double)w * (double)w / (2.0 * S);
	const double core = 4.0 * b * s * h * d * seen;
	const double qkv = 2.0 * b * s * H * (double)(h + 2 * g) * d;
	const double out = 2.0 * b * s * h * d * H;
	const double norm = 4.0 * b * sn * H;
	const int64_t o_bytes = b * s * h * d * e + b * h * s * 4;
	const int64_t qkv_bytes = b * s * (h + 2 * g) * d * e;
	const int64_t norm_bytes = b * sn * H * e;
	c->bytes[RMOE_ATTN_RECOMPUTE] = 0;
	c->bytes[RMOE_ATTN_KEEP_CORE] = o_bytes;
	c->bytes[RMOE_ATTN_KEEP_QKV] = o_bytes + qkv_bytes;
	c->bytes[RMOE_ATTN_KEEP_ALL] = o_bytes + qkv_bytes + norm_bytes;
	c->flops_saved[RMOE_ATTN_RECOMPUTE] = 0.0;
	c->flops_saved[RMOE_ATTN_KEEP_CORE] = core;
	c->flops_saved[RMOE_ATTN_KEEP_QKV] = core + qkv;
	c->flops_saved[RMOE_ATTN_KEEP_ALL] = core + qkv + norm;
	c->forward_flops = norm + qkv + core + out;
	c->step_flops = c->forward_flops + (norm + 2.0 * (qkv + out) + 2.5 * core) + (norm + qkv + core);
}

int rmoe_attn_layer_cost(const struct rmoe_attn_plan_input *in, int64_t layer,
                         struct rmoe_attn_layer_cost *c)
{
	int rc = check_input(in);
	if (rc)
		return rc;
	if (!c || layer < 0 || layer >= in->layers)
		return rmoe_error(RMOE_EINVAL, "attention plan: layer %lld, expected 0 <= layer < %lld",
		                  (long long)layer, (long long)in->layers);
	layer_cost(in, layer, c);
	return 0;
}

/* The next option of a layer and its ratio of FLOPs saved per byte kept. */
static double next_ratio(const struct rmoe_attn_layer_cost *c, int level, int64_t *bytes, double *flops)
{
	*bytes = c->bytes[level + 1] - c->bytes[level];
	*flops = c->flops_saved[level + 1] - c->flops_saved[level];
	return *bytes > 0 ? *flops / (double)*bytes : INFINITY;
}

/* Long: §3.4's greedy choice in its steps (input checks, per-layer costs,
 * the budget left, the greedy fill, the predicted gain), kept together so
 * that the order of the steps shows. */
int rmoe_attn_plan(const struct rmoe_attn_plan_input *in, struct rmoe_attn_plan *p)
{
	int rc = check_input(in);
	if (rc)
		return rc;
	if (!p)
		return rmoe_error(RMOE_EINVAL, "attention plan: plan is NULL");
	memset(p, 0, sizeof(*p));
	const int64_t L = in->layers;
	p->layers = L;
	p->local_tokens = in->seq_len / in->cp;
	p->local_heads = in->heads / in->tp;
	p->local_kv_heads = local_kv(in);

	struct rmoe_attn_layer_cost c;
	double attn_flops = 0.0;
	for (int64_t l = 0; l < L; l++) {
		layer_cost(in, l, &c);
		p->checkpoint_bytes += in->micro_batch * norm_tokens(in) * in->hidden * in->dtype_bytes;
		if (2 * c.bytes[RMOE_ATTN_KEEP_ALL] > p->recompute_transient_bytes)
			p->recompute_transient_bytes = 2 * c.bytes[RMOE_ATTN_KEEP_ALL];
		attn_flops += c.step_flops;
	}
	double moe_flops = 0.0;
	if (in->moe_ffn > 0) {
		/* Forward, the recomputation of §3.3, and a backward of twice the forward. */
		double fwd = 2.0 * in->micro_batch * norm_tokens(in) * 3.0 * in->hidden *
		             (double)(in->moe_topk * in->moe_ffn + in->moe_shared_ffn);
		moe_flops = 4.0 * fwd * (double)L;
	}
	p->step_flops_full = attn_flops + moe_flops;
	int64_t transient = in->moe_peak_bytes > p->recompute_transient_bytes ? in->moe_peak_bytes
	                                                                       : p->recompute_transient_bytes;
	p->peak_full_bytes = in->model_state_bytes + p->checkpoint_bytes + in->other_activation_bytes + transient;
	p->budget_bytes = in->device_bytes - p->peak_full_bytes;
	p->fits = p->budget_bytes >= 0;

	/* Greedy by FLOPs saved per byte; ties: the lower level, then the lower
	 * layer. A layer whose next option does not fit stops there: its later
	 * options extend that one. Retained activations live from a layer's
	 * forward to its backward, all of them at once at the turn of the step,
	 * so they add up on top of the full-recomputation peak. */
	unsigned char blocked[RMOE_ATTN_MAX_LAYERS] = {0};
	while (p->fits) {
		int64_t best = -1, best_bytes = 0;
		double best_ratio = -1.0, best_flops = 0.0;
		for (int64_t l = 0; l < L; l++) {
			if (blocked[l] || p->keep[l] == RMOE_ATTN_KEEP_ALL)
				continue;
			layer_cost(in, l, &c);
			int64_t bytes;
			double flops, r = next_ratio(&c, p->keep[l], &bytes, &flops);
			if (best < 0 || r > best_ratio || (r == best_ratio && p->keep[l] < p->keep[best])) {
				best = l;
				best_ratio = r;
				best_bytes = bytes;
				best_flops = flops;
			}
		}
		if (best < 0)
			break;
		if (p->used_bytes + best_bytes <= p->budget_bytes) {
			p->keep[best]++;
			p->used_bytes += best_bytes;
			p->flops_saved += best_flops;
			p->options_taken++;
		} else {
			blocked[best] = 1;
			p->options_refused++;
		}
	}
	for (int64_t l = 0; l < L; l++) {
		p->at_level[p->keep[l]]++;
		p->retained_layers += p->keep[l] > RMOE_ATTN_RECOMPUTE;
		p->full_layers += p->keep[l] == RMOE_ATTN_KEEP_ALL;
	}
	p->peak_plan_bytes = p->peak_full_bytes + p->used_bytes;
	p->predicted_gain = p->step_flops_full > p->flops_saved
	                            ? p->step_flops_full / (p->step_flops_full - p->flops_saved)
	                            : 1.0;
	return 0;
}

/* ---- output ------------------------------------------------------------- */

struct text {
	char *buf;
	size_t len, used;
};

static void say(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct text *t, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	size_t room = t->used < t->len ? t->len - t->used : 0;
	int n = vsnprintf(room ? t->buf + t->used : NULL, room, fmt, ap);
	va_end(ap);
	if (n > 0)
		t->used += (size_t)n;
}

static double gib(int64_t b)
{
	return (double)b / (1024.0 * 1024.0 * 1024.0);
}

/* An empty text in buf, and the layer's cost: 0 when there is no plan to
 * write. */
static int text_begin(struct text *t, char *buf, size_t len, const struct rmoe_attn_plan_input *in,
                      const struct rmoe_attn_plan *p, struct rmoe_attn_layer_cost *c)
{
	*t = (struct text){buf, len, 0};
	if (len)
		buf[0] = '\0';
	return p && !rmoe_attn_layer_cost(in, 0, c);
}

static double mib(int64_t b)
{
	return (double)b / (1024.0 * 1024.0);
}

int rmoe_attn_plan_format(const struct rmoe_attn_plan_input *in, const struct rmoe_attn_plan *p,
                          const char *label, char *buf, size_t len)
{
	struct text t;
	struct rmoe_attn_layer_cost c;
	if (!text_begin(&t, buf, len, in, p, &c))
		return 0;
	say(&t, "attention recomputation plan%s%s%s: %lld layers, sequence %lld, micro-batch %lld, "
	    "TP=%lld CP=%lld SP %s EP=%lld, %d-byte activations\n",
	    label ? " (" : "", label ? label : "", label ? ")" : "", (long long)in->layers,
	    (long long)in->seq_len, (long long)in->micro_batch, (long long)in->tp, (long long)in->cp,
	    in->sp ? "on" : "off", (long long)in->ep, in->dtype_bytes);
	say(&t, "  per device: %lld query tokens, %lld of %lld heads, %lld of %lld KV heads, head dim %lld\n",
	    (long long)p->local_tokens, (long long)p->local_heads, (long long)in->heads,
	    (long long)p->local_kv_heads, (long long)in->kv_heads, (long long)in->head_dim);
	say(&t, "  %-10s %-15s %11s %14s %12s %9s\n", "option", "keeps", "MiB/layer", "GFLOP saved",
	    "GFLOP/MiB", "taken by");
	int64_t taken = p->layers;
	for (int k = 1; k < RMOE_ATTN_NKEEP; k++) {
		int64_t db = c.bytes[k] - c.bytes[k - 1];
		double df = c.flops_saved[k] - c.flops_saved[k - 1];
		taken -= p->at_level[k - 1];
		say(&t, "  %-10s %-15s %11.2f %14.2f %12.3f %9lld\n", keep_names[k], keep_adds[k], mib(db),
		    df * 1e-9, db > 0 ? df * 1e-9 / mib(db) : 0.0, (long long)taken);
	}
	if (in->window)
		say(&t, "  (layer 0's costs; layers with a sliding window save less)\n");
	say(&t, "  memory: device %.2f GiB; peak with full recomputation %.2f GiB = model states %.2f + layer "
	    "inputs %.2f + other activations %.2f + max(MoE peak %.2f, attention recompute %.2f)\n",
	    gib(in->device_bytes), gib(p->peak_full_bytes), gib(in->model_state_bytes), gib(p->checkpoint_bytes),
	    gib(in->other_activation_bytes), gib(in->moe_peak_bytes), gib(p->recompute_transient_bytes));
	if (!p->fits) {
		say(&t, "  does not fit: %.2f GiB over the device even with full recomputation; nothing retained\n",
		    gib(-p->budget_bytes));
		return (int)t.used;
	}
	say(&t, "  budget %.2f GiB; kept %.2f GiB; peak %.2f GiB\n", gib(p->budget_bytes), gib(p->used_bytes),
	    gib(p->peak_plan_bytes));
	say(&t, "  retained: %lld of %lld attention layers (%lld fully, %lld partially)\n",
	    (long long)p->retained_layers, (long long)in->layers, (long long)p->full_layers,
	    (long long)(p->retained_layers - p->full_layers));
	say(&t, "  layers:");
	for (int64_t l = 0; l < in->layers;) {
		int64_t m = l;
		while (m + 1 < in->layers && p->keep[m + 1] == p->keep[l])
			m++;
		if (m > l)
			say(&t, "%s %lld-%lld %s", l ? "," : "", (long long)l, (long long)m, keep_names[p->keep[l]]);
		else
			say(&t, "%s %lld %s", l ? "," : "", (long long)l, keep_names[p->keep[l]]);
		l = m + 1;
	}
	say(&t, "\n");
	say(&t, "  recomputation avoided: %.2f of %.2f TFLOP per device and micro-batch (%.1f%%); predicted "
	    "throughput gain %.3fx\n",
	    p->flops_saved * 1e-12, p->step_flops_full * 1e-12,
	    p->step_flops_full > 0 ? 100.0 * p->flops_saved / p->step_flops_full : 0.0, p->predicted_gain);
	return (int)t.used;
}

int rmoe_attn_plan_json(const struct rmoe_attn_plan_input *in, const struct rmoe_attn_plan *p,
                        const char *label, char *buf, size_t len)
{
	struct text t;
	struct rmoe_attn_layer_cost c;
	if (!text_begin(&t, buf, len, in, p, &c))
		return 0;
	say(&t, "{\"label\": \"%s\", \"layers\": %lld, \"fits\": %s, \"budget_bytes\": %lld, "
	    "\"peak_full_bytes\": %lld, \"used_bytes\": %lld, \"peak_plan_bytes\": %lld, ",
	    label ? label : "", (long long)in->layers, p->fits ? "true" : "false", (long long)p->budget_bytes,
	    (long long)p->peak_full_bytes, (long long)p->used_bytes, (long long)p->peak_plan_bytes);
	say(&t, "\"retained_layers\": %lld, \"full_layers\": %lld, \"at_level\": {", (long long)p->retained_layers,
	    (long long)p->full_layers);
	for (int k = 0; k < RMOE_ATTN_NKEEP; k++)
		say(&t, "%s\"%s\": %lld", k ? ", " : "", keep_names[k], (long long)p->at_level[k]);
	say(&t, "}, \"options\": [");
	for (int k = 1; k < RMOE_ATTN_NKEEP; k++)
		say(&t, "%s{\"option\": \"%s\", \"bytes\": %lld, \"flops_saved\": %.6e}", k > 1 ? ", " : "",
		    keep_names[k], (long long)(c.bytes[k] - c.bytes[k - 1]), c.flops_saved[k] - c.flops_saved[k - 1]);
	say(&t, "], \"keep\": [");
	for (int64_t l = 0; l < in->layers; l++)
		say(&t, "%s\"%s\"", l ? ", " : "", keep_names[p->keep[l]]);
	say(&t, "], \"step_flops_full\": %.6e, \"flops_saved\": %.6e, \"predicted_gain\": %.6f}",
	    p->step_flops_full, p->flops_saved, p->predicted_gain);
	return (int)t.used;
}
